#!/usr/bin/env bash
# Installs what is missing, builds everything (GUI, tests, benchmarks) and runs every test
# through CTest. Prints CTest's summary; exits non-zero on any failure.
#   ./packaging/test.sh [CTEST ARGS...]   e.g. -L core, -R cli, -LE bench
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/packaging/deps-debian.sh"
LATHE_CMAKE_ARGS="${LATHE_CMAKE_ARGS:-} -DLATHE_GUI=ON -DLATHE_TESTS=ON" "$root/packaging/build.sh"
cd "${LATHE_BUILD_DIR:-$root/build}"
# No display is needed: GUI tests use the offscreen platform or start their own Xvfb.
export QT_QPA_PLATFORM=offscreen
ctest --output-on-failure --timeout 600 -j "${LATHE_TEST_JOBS:-2}" "$@"
