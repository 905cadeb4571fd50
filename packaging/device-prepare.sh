#!/usr/bin/env bash
# Stages what packaging/device-check.sh needs on the GPU machine and cannot fetch there (it
# reaches no package archive): Catch2 v2, unpacked from Debian's package into .device/ (ignored
# by git; name it in the device tool's `carry`). Run here, once per checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .device
rm -rf .device/catch2 .device/*.deb
(cd .device && apt-get download catch2 >/dev/null 2>&1) || { echo "device-prepare: apt-get download catch2 failed (run apt-get update?)" >&2; exit 1; }
version=$(dpkg-deb -f .device/catch2_*.deb Version)
dpkg -x .device/catch2_*.deb .device/catch2
rm -f .device/*.deb
test -f .device/catch2/usr/lib/cmake/Catch2/Catch2Config.cmake
echo "device-prepare: Catch2 $version staged in .device/catch2 ($(du -sh .device | cut -f1)); carry .device"
