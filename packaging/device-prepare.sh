#!/usr/bin/env bash
# Stages what packaging/device-check.sh needs on the GPU machine and cannot fetch there (it
# reaches no package archive), in .device/ (ignored by git; name it in the device tool's
# `carry`). Run here, once per checkout:
#     ./packaging/device-prepare.sh          Catch2 v2 (unpacked): enough for the kernel checks
#     ./packaging/device-prepare.sh --full   and the Debian packages a LATHE_GUI=OFF build needs
#                                            besides LibTorch (as .deb files, ~20 MB, unpacked
#                                            there into /tmp/lathe-deps, never into /)
set -euo pipefail
cd "$(dirname "$0")/.."
full=0
[ "${1:-}" = "--full" ] && full=1
mkdir -p .device
rm -rf .device/catch2 .device/debs .device/*.deb
(cd .device && apt-get download catch2 >/dev/null 2>&1) || { echo "device-prepare: apt-get download catch2 failed (run apt-get update?)" >&2; exit 1; }
version=$(dpkg-deb -f .device/catch2_*.deb Version)
dpkg -x .device/catch2_*.deb .device/catch2
rm -f .device/*.deb
test -f .device/catch2/usr/lib/cmake/Catch2/Catch2Config.cmake
echo "device-prepare: Catch2 $version staged in .device/catch2"
if [ $full = 1 ]; then
    # Headers, CMake configs and the shared libraries they point at, with the runtime
    # libraries libssh needs; prometheus-cpp's CMake config looks for civetweb and curl.
    pkgs=(libboost1.74-dev libsqlite3-dev libsqlite3-0 libssh-dev libssh-4 libssl-dev libssl3 zlib1g-dev zlib1g
          libtomlplusplus-dev libtomlplusplus3 nlohmann-json3-dev libcli11-dev libsimdjson-dev libsimdjson14
          prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libprometheus-cpp-push1.0
          civetweb libcivetweb-dev libcivetweb1 libcurl4-openssl-dev libcurl4
          libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 libcom-err2
          libgloo-dev   # headers only, for ProcessGroupGloo.hpp should a LibTorch lack its own
          libonnx-dev libonnx1 libonnxifi libprotobuf32 libgraphviz-dev libgvc6 libcgraph6 libcdt5 libpathplan4
          libxdot4 libexpat1 libltdl7 libhiredis-dev libhiredis0.14 libturbojpeg0-dev libturbojpeg0
          libpng-dev libpng16-16 pkgconf pkgconf-bin libpkgconf3)  # pkgconf: run from the prefix
    mkdir -p .device/debs
    (cd .device/debs && apt-get download "${pkgs[@]}" >/dev/null 2>&1) ||
        { echo "device-prepare: apt-get download failed for one of: ${pkgs[*]}" >&2; exit 1; }
    echo "device-prepare: ${#pkgs[@]} Debian packages staged in .device/debs"
fi
echo "device-prepare: $(du -sh .device | cut -f1) in .device; carry .device"
