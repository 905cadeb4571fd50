#!/usr/bin/env bash
# The GPU checks, as one script for the device tool's machine (NVIDIA H200, CUDA toolkit,
# PyTorch with its LibTorch, CMake, ninja; none of our Debian packages). Stage first, here:
#     ./packaging/device-prepare.sh [--full]
# then run this there with `.device` carried:
#     bash packaging/device-check.sh          kernels/ alone (LATHE_KERNELS_ONLY): the CUDA
#                                             kernel tests and bench_kernels_cuda, ~2-3 minutes
#     bash packaging/device-check.sh --full   and the rest without the GUI, against PyTorch's
#                                             LibTorch: gpu_tests (fp16/bf16 training, device-timed
#                                             profile phases and ops, serving on the GPU, ranks on
#                                             GPUs) and the CUDA kernel tests and benchmark
#     bash packaging/device-check.sh --full --all   also every other non-GUI test and
#                                             bench_serving (a second call: a device command may
#                                             run 10 minutes; the build in /tmp stays while the
#                                             machine is warm)
# Every log lands in $OUT. Exit status: that of the tests.
set -uo pipefail
cd "$(dirname "$0")/.."
full=0
all=0
[ "${1:-}" = "--full" ] && full=1
[ "${2:-}" = "--all" ] && all=1
out=${OUT:-/tmp/lathe-device-out}
mkdir -p "$out"
jobs=$(nproc)
catch2=$PWD/.device/catch2/usr
if [ ! -f "$catch2/lib/cmake/Catch2/Catch2Config.cmake" ]; then
    echo "device-check: no Catch2 in .device/: run ./packaging/device-prepare.sh on the development machine and carry .device" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>&1 | tee "$out/gpu.txt"
nvcc --version 2>&1 | tail -2 | tee -a "$out/gpu.txt"
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
arch=${arch:-90}
start=$(date +%s)

if [ $full = 0 ]; then
    build=/tmp/lathe-build-kernels
    cmake -S . -B "$build" -G Ninja -DLATHE_KERNELS_ONLY=ON -DLATHE_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_PREFIX_PATH="$catch2" >"$out/configure.log" 2>&1 ||
        { tail -30 "$out/configure.log"; exit 1; }
    cmake --build "$build" -j "$jobs" >"$out/build.log" 2>&1 || { grep -m20 -B2 -A6 "error" "$out/build.log"; exit 1; }
    echo "device-check: built in $(( $(date +%s) - start )) s"
    (cd "$build" && ctest --output-on-failure -j 4) >"$out/ctest.log" 2>&1
    rc=$?
    tail -25 "$out/ctest.log"
    "$build/bin/kernels_tests" "[cuda]" --durations yes >"$out/kernels_cuda.log" 2>&1 || true
    "$build/bin/bench_kernels_cuda" --out "$out" 2>&1 | tee "$out/bench_kernels_cuda.txt"
    echo "device-check: tests exit $rc; logs in $out"
    exit $rc
fi

# --full: the Debian packages unpack into a private prefix (never into /), with absolute
# symbolic links re-pointed inside it; LibTorch comes from the machine's PyTorch.
deps=/tmp/lathe-deps
ls .device/debs/*.deb >/dev/null 2>&1 || { echo "device-check: no .device/debs: run ./packaging/device-prepare.sh --full here" >&2; exit 2; }
rm -rf "$deps" && mkdir -p "$deps"
for f in .device/debs/*.deb; do dpkg -x "$f" "$deps" || { echo "device-check: cannot unpack $f" >&2; exit 1; }; done
rm -f "$deps"/usr/lib/x86_64-linux-gnu/libgloo.so*  # Gloo is inside PyTorch's libtorch_cpu: headers only
find "$deps" -type l | while read -r l; do
    t=$(readlink "$l")
    case "$t" in /*) [ -e "$deps$t" ] && ln -sfn "$deps$t" "$l" ;; esac
done
# pkg-config (graphviz, turbojpeg, hiredis) from the prefix, reading only the prefix's .pc files,
# their paths re-rooted in it.
mkdir -p "$deps/bin"
cat >"$deps/bin/pkg-config" <<EOF
#!/bin/sh
export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu" PKG_CONFIG_SYSROOT_DIR="$deps"
export PKG_CONFIG_LIBDIR="$deps/usr/lib/x86_64-linux-gnu/pkgconfig:$deps/usr/share/pkgconfig"
export PKG_CONFIG_SYSTEM_INCLUDE_PATH="$deps/usr/include"
exec "$deps/usr/bin/pkgconf" "\$@"
EOF
chmod +x "$deps/bin/pkg-config"
torch_prefix=${LATHE_TORCH_PREFIX:-$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')}
# nccl.h: PyTorch's NCCL wheel has it when the CUDA toolkit does not.
nccl_inc=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "include"))' 2>/dev/null || true)
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cxx11 abi", torch.compiled_with_cxx11_abi())' 2>&1 | tee -a "$out/gpu.txt"
# The packages' libraries only for our programs (the build gives them an RPATH too), never for
# the machine's own tools (cmake, nvcc), which bookworm's libssl or libcurl could upset.
libdirs="$deps/usr/lib/x86_64-linux-gnu:$deps/lib/x86_64-linux-gnu"
run() { LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }
build=/tmp/lathe-build-full
# -idirafter: the packages' headers come after LibTorch's own and the machine's, so they fill
# gaps (libssh, Boost, prometheus-cpp ...) without shadowing what PyTorch ships (e.g. Gloo).
cmake -S . -B "$build" -G Ninja -DLATHE_GUI=OFF -DLATHE_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_PREFIX_PATH="$torch_prefix;$deps/usr;$catch2" ${nccl_inc:+-DNCCL_INCLUDE_DIR=$nccl_inc} \
    -DOPENSSL_ROOT_DIR="$deps/usr" -DPKG_CONFIG_EXECUTABLE="$deps/bin/pkg-config" -DCMAKE_CXX_FLAGS="-idirafter $deps/usr/include" \
    -DCMAKE_BUILD_RPATH="$deps/usr/lib/x86_64-linux-gnu;$deps/lib/x86_64-linux-gnu" >"$out/configure.log" 2>&1 ||
    { tail -40 "$out/configure.log"; exit 1; }
grep -E "Found|found|NCCL" "$out/configure.log" | head -30
# Without --all only what the GPU checks run is built (lathectl, gpu_tests, the kernels' tests
# and benchmark): a device command may run 10 minutes, and the test programs are most of a build.
targets=()
[ $all = 1 ] || targets=(--target ${LATHE_CHECK_TARGETS:-lathectl gpu_tests kernels_tests bench_kernels_cuda})
timeout "${LATHE_BUILD_TIMEOUT:-420}" cmake --build "$build" -j "$jobs" "${targets[@]}" -- -k 0 >"$out/build.log" 2>&1
brc=$?
echo "device-check: build exit $brc in $(( $(date +%s) - start )) s"
if [ $brc != 0 ]; then grep -m40 -A8 "error:" "$out/build.log"; fi
# The GPU checks first (gpu_tests, the kernels' CUDA cases), then with --all everything else
# that runs without a display or the network (compat fetches from Debian's archive).
labels=${LATHE_CHECK_LABELS:-gpu|kernels}  # e.g. LATHE_CHECK_LABELS=gpu LATHE_CHECK_TARGETS="lathectl gpu_tests"
[ $all = 1 ] && labels="."
(cd "$build" && run timeout "${LATHE_TEST_TIMEOUT:-480}" ctest -L "$labels" -LE "bench|fuzz|compat|widgets" --output-on-failure -j 8 \
    --timeout 300) >"$out/ctest.log" 2>&1
rc=$?
grep -E "tests passed|Failed|\*\*\*|Not Run" "$out/ctest.log" | head -40
[ -x "$build/bin/kernels_tests" ] && run "$build/bin/kernels_tests" "[cuda]" --durations yes >"$out/kernels_cuda.log" 2>&1 || true
[ -x "$build/bin/bench_kernels_cuda" ] && run "$build/bin/bench_kernels_cuda" --out "$out" >"$out/bench_kernels_cuda.txt" 2>&1 || true
tail -14 "$out/bench_kernels_cuda.txt"
if [ $all = 1 ]; then
    run timeout 240 "$build/bin/bench_serving" --quick --out "$out" >"$out/bench_serving.txt" 2>&1 || true
    tail -8 "$out/bench_serving.txt"
fi
echo "device-check: build exit $brc, tests exit $rc in $(( $(date +%s) - start )) s; logs in $out"
[ $brc = 0 ] || exit $brc
exit $rc
