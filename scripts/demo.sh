#!/usr/bin/env bash
# The main demo: builds Anview in Release and runs a 2-rank point-to-point benchmark on this
# host (latency, streaming bandwidth, then allreduce from 8 B to 64 MiB with the algorithm each
# size gets).
set -euo pipefail
cd "$(dirname "$0")/.."
# A unity build (eight sources per compiled file): 2.9 instead of 4.9 minutes on two cores.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=ON >/dev/null
cmake --build build -j "$(nproc)"
build/bin/anview-run -n 2 build/bin/anview-perf pingpong -b 8 -e 1M
build/bin/anview-run -n 2 build/bin/anview-perf bw -b 64K -e 16M
build/bin/anview-run -n 2 build/bin/anview-perf allreduce -b 8 -e 64M -f 8 --check
