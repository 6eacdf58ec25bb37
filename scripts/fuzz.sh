#!/usr/bin/env bash
# Builds the fuzz targets with clang's libFuzzer (and ASan+UBSan) and runs each for a while
# on a scratch copy of its checked-in corpus (tests/fuzz/corpus/<target>), two at a time.
#   scripts/fuzz.sh [SECONDS per target, default 60] [TARGET...]
# A crash stops the run: the input that caused it is left in build-fuzz/artifacts/; add it to
# the target's corpus as a regression (ctest replays the corpus in every build), fix the bug.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(fuzz_store_protocol fuzz_tcp_handshake fuzz_shm_ring fuzz_config
  fuzz_p2p_frames fuzz_tcp_stream fuzz_rpc_frame fuzz_pubsub_frame)

echo "=== fuzz.sh: building build-fuzz (clang, libFuzzer, ASan+UBSan)"
# -O1 and line tables only, as libFuzzer's documentation builds its targets: a faster build,
# and the crash reports still carry file:line. A unity build, as in scripts/test.sh.
cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" -DANVIEW_FUZZ=ON \
  -DANVIEW_PYTHON=OFF -DCMAKE_UNITY_BUILD=ON >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target anview_fuzzers

mkdir -p build-fuzz/artifacts
run_one() {  # TARGET
  local target=$1 scratch=build-fuzz/scratch/$1
  rm -rf "$scratch" && mkdir -p "$scratch"
  if build-fuzz/bin/"$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix=build-fuzz/artifacts/"$target"- \
    "$scratch" tests/fuzz/corpus/"$target" >build-fuzz/"$target".log 2>&1; then
    echo "=== fuzz.sh: $target: $(grep -m1 -E '^Done [0-9]+ runs' build-fuzz/"$target".log)," \
      "corpus $(ls "$scratch" | wc -l) new inputs"
  else
    echo "=== fuzz.sh: $target FAILED; the end of its log (build-fuzz/$target.log):"
    tail -40 build-fuzz/"$target".log
    return 1
  fi
}

status=0
jobs=$(nproc)
for ((i = 0; i < ${#targets[@]}; i += jobs)); do
  pids=()
  for target in "${targets[@]:i:jobs}"; do
    run_one "$target" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
done
exit $status
