#!/usr/bin/env bash
# Installs every Debian 12 package Lathe needs to build, test and run. Idempotent and
# near-instant when everything is present: only missing packages reach apt-get.
#   ./packaging/deps-debian.sh            everything (GUI, tests, benchmarks)
#   ./packaging/deps-debian.sh --headless no Qt (for -DLATHE_GUI=OFF hosts, e.g. remote GPU workers)
set -euo pipefail

core=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev libopenblas0-pthread          # LibTorch 1.13; OpenBLAS makes CPU matmuls ~45x faster than reference BLAS
  libblas-dev                                # cblas.h and libblas.so for the plain-MLP step (same libblas.so.3)
  libgloo-dev                                # c10d Gloo process group (data-parallel training on the CPU)
  libsqlite3-dev libssh-dev libssl-dev zlib1g-dev
  libtomlplusplus-dev nlohmann-json3-dev libcli11-dev
  libboost-dev prometheus-cpp-dev            # Beast/Asio HTTP server and client; Prometheus metrics
  libsimdjson-dev                            # the inference server's request parser
  libonnx-dev libgraphviz-dev                # model graphs: ONNX files, layout and SVG/PNG (libgvc)
  graphviz                                   # the dot program: the layout benchmark's baseline
  libturbojpeg0-dev libpng-dev                # image-folder data sets: JPEG (libjpeg-turbo) and PNG decoding
  libhiredis-dev redis-server                 # the data pipeline's Redis sample cache (redis-server: its tests)
  python3-pil                                # reference images for the image tests (PIL's decoder and resize)
  catch2 openssh-server openssh-client       # tests; sshd is started on loopback by the remote tests
  python3-torch                              # PyTorch baseline of the trainer benchmark
  python3-torchvision python3-onnx           # real architectures (no weights) for the model-graph tests
  python3-optuna                             # the tuning benchmark's baseline (Optuna's TPE)
  clang libclang-rt-14-dev                   # libFuzzer for the request-parser fuzz test
  clang-format                               # the style test (packaging/check-format.sh)
  wrk nginx-light                            # bench_serving's client and its baseline server
)
gui=(
  qt6-base-dev libqcustomplot-dev libgl-dev fonts-dejavu-core
  xvfb xauth                                 # the real-window smoke test
)

pkgs=("${core[@]}")
[[ "${1:-}" == "--headless" ]] || pkgs+=("${gui[@]}")

missing=()
for p in "${pkgs[@]}"; do
  if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]]; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  exit 0
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "deps-debian.sh: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
echo "Installing ${#missing[@]} Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
