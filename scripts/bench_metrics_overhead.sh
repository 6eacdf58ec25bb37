#!/usr/bin/env bash
# What metrics cost: 8-byte pingpong and 8-byte allreduce latency of two builds run in turn on
# this host, one with metrics (the default) and one configured with -DANVIEW_METRICS=OFF.
# Prints each run, then the medians and the ratio with/without.
#   scripts/bench_metrics_overhead.sh [WITH_BUILD [WITHOUT_BUILD [REPS [RANKS]]]]
# Builds the second one first if needed:
#   cmake -S . -B build-nometrics -DCMAKE_BUILD_TYPE=Release -DANVIEW_METRICS=OFF \
#     -DANVIEW_PYTHON=OFF && cmake --build build-nometrics --target anview-run anview-perf
set -euo pipefail
cd "$(dirname "$0")/.."
with=${1:-build}
without=${2:-build-nometrics}
reps=${3:-9}
ranks=${4:-2}
for b in "$with" "$without"; do
  [[ -x $b/bin/anview-perf ]] || { echo "no $b/bin/anview-perf: build it first" >&2; exit 2; }
done

# One run: the p50 (pingpong) or time_us (allreduce) of an 8-byte sweep point.
measure() {  # BUILD OP
  local build=$1 op=$2 field=lat_us_p50
  [[ $op == allreduce ]] && field=time_us
  "$build/bin/anview-run" -n "$ranks" "$build/bin/anview-perf" "$op" -b 8 -e 8 -n 200000 \
    --json 2>/dev/null | /usr/bin/python3 -c "import json,sys; print(json.loads(sys.stdin.readline())['$field'])"
}

declare -A runs
for ((r = 1; r <= reps; r++)); do
  for op in pingpong allreduce; do
    for b in "$with" "$without"; do
      v=$(measure "$b" "$op")
      runs[$op,$b]+="$v "
      echo "rep $r $op $b: $v us"
    done
  done
done
echo
for op in pingpong allreduce; do
  /usr/bin/python3 - "$op" "${runs[$op,$with]}" "${runs[$op,$without]}" <<'PY'
import statistics, sys
op, a, b = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
ma, mb = statistics.median(a), statistics.median(b)
print(f"{op:9s} 8 B: with metrics {ma:.3f} us, without {mb:.3f} us, ratio {ma / mb:.3f} "
      f"(median of {len(a)} runs each)")
PY
done
