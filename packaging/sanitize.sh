#!/usr/bin/env bash
# Builds core, kernels, remote and lathectl with AddressSanitizer and UndefinedBehaviorSanitizer
# (GUI and CUDA off) in their own directory, and runs the non-GPU, non-GUI tests under them.
# Not part of CI (it takes about an hour on 2 cores); run it before resolving a change to core,
# kernels or remote.
#   ./packaging/sanitize.sh [CTEST ARGS...]     e.g. -R core_tests
# Build directory: LATHE_ASAN_DIR (default build-asan/ beside build/).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${LATHE_ASAN_DIR:-$root/build-asan}"
"$root/packaging/deps-debian.sh"
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
mkdir -p "$build"
# RelWithDebInfo for readable reports. liblathe_torch, opened with dlopen, finds the sanitizer
# runtime already loaded by the instrumented program.
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DLATHE_GUI=OFF -DLATHE_TESTS=ON -DLATHE_CUDA=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >"$build/configure.log" 2>&1 \
  || { cat "$build/configure.log"; echo "configure failed (log: $build/configure.log)" >&2; exit 1; }
cmake --build "$build" -j "${LATHE_JOBS:-$(nproc)}"
cd "$build"
# LibTorch is not instrumented: its own allocations are not checked, and it frees at exit what
# leak detection would report (detect_leaks=0). new/delete[] pairs inside it are its own
# business (alloc_dealloc_mismatch=0). Any report fails the test that made it.
export ASAN_OPTIONS="detect_leaks=0:alloc_dealloc_mismatch=0:abort_on_error=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
ctest --output-on-failure --timeout 1800 -j "${LATHE_TEST_JOBS:-2}" -LE 'gpu|widgets|bench|style|compat' "$@"
