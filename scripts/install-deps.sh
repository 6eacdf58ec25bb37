#!/usr/bin/env bash
# Installs what building and testing Anview needs, from Debian 12's packages. Run as root.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config
  # the job secret: HMAC-SHA256 and nonces (src/base/auth.cpp)
  libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # the fuzz targets (tests/fuzz, scripts/fuzz.sh): clang's libFuzzer and sanitizer runtimes
  clang libclang-rt-14-dev
  libcli11-dev nlohmann-json3-dev
  iproute2 procps
  # the multi-host lab's rate limits are measured with iperf3 (README, "The multi-host lab");
  # its debconf question (start a daemon?) takes its default, no, under noninteractive
  iperf3
  # anview-perf --plot draws with gnuplot (its test skips without it)
  gnuplot-nox
  # the metrics endpoint's test scrapes with curl and parses with Prometheus' own parser
  curl python3-prometheus-client
  # the Python package and the PyTorch backend (python/), their tests and benchmark
  python3-dev pybind11-dev python3-numpy python3-pytest python3-torch libtorch-dev
  # the UCX transport (src/transport/ucx: RDMA fabrics through UCX), and ucx_perftest, the peer
  # its benchmark is measured against
  libucx-dev ucx-utils
  # the optional protobuf helper of RPC (include/anview/rpc_protobuf.hpp) and its test
  libprotobuf-dev
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
