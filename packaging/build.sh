#!/usr/bin/env bash
# Configures and builds Lathe into build/ (Release, Ninja, ccache when present).
#   packaging/build.sh [TARGET...]   (default: everything)
# Extra CMake arguments: LATHE_CMAKE_ARGS="-DLATHE_CUDA=OFF ..."; an official LibTorch 2.x is
# picked up through CMAKE_PREFIX_PATH.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="${LATHE_BUILD_DIR:-$root/build}"
jobs="${LATHE_JOBS:-$(nproc)}"
mkdir -p "$build"
# shellcheck disable=SC2086
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${LATHE_CMAKE_ARGS:-} >"$build/configure.log" 2>&1 \
  || { cat "$build/configure.log"; echo "configure failed (log: $build/configure.log)" >&2; exit 1; }
grep -A100 -- '-- The following features have been enabled' "$build/configure.log" | grep -v '^--  *$' || true
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "$build" -j "$jobs" ${targets[@]+"${targets[@]}"}
