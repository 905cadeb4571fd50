#!/usr/bin/env bash
# The GPU checks, as one script for the device tool's machine (NVIDIA H200, CUDA toolkit, CMake,
# ninja; none of our Debian packages). Stage Catch2 first, here:
#     ./packaging/device-prepare.sh
# then run this there with `.device` carried:
#     bash packaging/device-check.sh          (about 2-3 minutes of device time)
# It builds kernels/ with CUDA for the machine's GPU (LATHE_KERNELS_ONLY: no LibTorch, Qt or
# the other packages), runs the kernel tests (the CUDA ones skip nowhere there) and the CUDA
# kernel benchmark, and leaves every log in $OUT. Exit status: that of the tests.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/lathe-device-out}
mkdir -p "$out"
catch2=$PWD/.device/catch2/usr
if [ ! -f "$catch2/lib/cmake/Catch2/Catch2Config.cmake" ]; then
    echo "device-check: no Catch2 in .device/: run ./packaging/device-prepare.sh on the development machine and carry .device" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>&1 | tee "$out/gpu.txt"
nvcc --version 2>&1 | tail -2 | tee -a "$out/gpu.txt"
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
build=/tmp/lathe-build-kernels
start=$(date +%s)
cmake -S . -B "$build" -G Ninja -DLATHE_KERNELS_ONLY=ON -DLATHE_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="${arch:-90}" -DCMAKE_PREFIX_PATH="$catch2" >"$out/configure.log" 2>&1 ||
    { tail -30 "$out/configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
echo "device-check: built in $(( $(date +%s) - start )) s"
(cd "$build" && ctest --output-on-failure -j 4) >"$out/ctest.log" 2>&1
rc=$?
tail -25 "$out/ctest.log"
"$build/bin/kernels_tests" "[cuda]" --durations yes >"$out/kernels_cuda.log" 2>&1 || true
"$build/bin/bench_kernels_cuda" --out "$out" 2>&1 | tee "$out/bench_kernels_cuda.txt"
echo "device-check: tests exit $rc; logs in $out"
exit $rc
