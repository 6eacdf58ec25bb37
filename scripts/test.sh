#!/usr/bin/env bash
# Builds Anview and runs the whole test suite:
#   1. Release build, every test (unit, launcher, multi-process and fault tests, and the
#      Python package and PyTorch backend with pytest);
#   2. ASan+UBSan build, every test;
#   3. TSan build of the unit tests (the threaded core: thread-per-rank communicators);
#   4. the fuzz targets with clang's libFuzzer, 20 s each (scripts/fuzz.sh; eight targets, two
#      at a time: 80 s). Each run starts from the checked-in corpus, which ctest also replays
#      in every build; 20 s instead of 30 s took 40 s off a CI run that was at 30-32 minutes.
# ctest runs two tests at a time on a 2-core machine, but every test that starts several
# processes (the multi-process, launcher and Python tests) declares PROCESSORS >= 2 and so runs
# alone: only single-process tests share the machine.
# The sanitizer builds compile at -O1 with line tables only (-g1): what ASan, UBSan and TSan
# need for their reports with file:line stacks, at half the compile time of -O2 -g (the ASan
# build was 15 of the 52 minutes the whole script took on a 2-core machine).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
# Every stage's line says when it started (minutes:seconds into this script), so a CI log shows
# where the time goes.
at() { printf '(at %d:%02d)' $((SECONDS / 60)) $((SECONDS % 60)); }

configure_and_build() {  # BUILD_DIR TARGET CMAKE_ARGS...
  local dir=$1 target=$2
  shift 2
  echo "=== test.sh: building $dir ($*) $(at)"
  cmake -S . -B "$dir" -G Ninja "$@" >/dev/null
  cmake --build "$dir" -j "$jobs" --target "$target"
}

sanitizer_flags="-O1 -g1 -DNDEBUG"
# Every build here is a unity build (scripts/fuzz.sh's too): CMake compiles a target's sources
# eight to a file, so the headers they share (the standard library, gtest, json) are parsed
# and their templates instantiated once per eight files, not once per file. On two cores:
# Release 4.9 -> 2.9 minutes, ASan+UBSan 6.4 -> 3.9, TSan 2.8 -> 1.3, fuzz 2.5 -> 1.4. That
# every file compiles on its own (includes what it uses) is left to a developer's default
# build, which compiles one unit per source.
configure_and_build build-tsan anview_unit_tests -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$sanitizer_flags" -DANVIEW_SANITIZE=thread \
  -DCMAKE_UNITY_BUILD=ON
echo "=== test.sh: unit tests under ThreadSanitizer ($jobs shards at once) $(at)"
# UCX's memory hooks (libucm patches mmap/madvise for its registration cache) run inside
# exiting threads' stack teardown, where TSan's interceptors crash: off for this stage (there
# is no RDMA memory whose registrations they would keep coherent). One process per core, each
# a gtest shard: 3.1 instead of 3.8 minutes on two cores (a single process leaves a core idle
# while its tests wait on timeouts).
tsan_shard() {  # INDEX
  UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=no \
  ANVIEW_LOG_LEVEL=error TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  GTEST_TOTAL_SHARDS=$jobs GTEST_SHARD_INDEX=$1 \
    build-tsan/bin/anview_unit_tests >"build-tsan/shard-$1.log" 2>&1
}
shard_pids=()
for ((i = 0; i < jobs; i++)); do
  tsan_shard "$i" &
  shard_pids+=($!)
done
tsan_status=0
for ((i = 0; i < jobs; i++)); do
  if wait "${shard_pids[i]}"; then
    echo "=== test.sh: TSan shard $i: $(grep -E '^\[  PASSED  \]' "build-tsan/shard-$i.log")"
  else
    # The full log names every test that ran (a crash or an abort leaves no gtest summary):
    # its failures, the test it died in, and its last lines.
    log="build-tsan/shard-$i.log"
    echo "=== test.sh: TSan shard $i FAILED; failures in $log:"
    grep -m 40 -E '^\[  FAILED  \]|Failure$' "$log" || true  # none after a crash
    echo "=== test.sh: the last test it started: $(grep -E '^\[ RUN      \]' "$log" | tail -1)"
    echo "=== test.sh: the last 80 lines of $log:"
    tail -n 80 "$log"
    tsan_status=1
  fi
done
((tsan_status == 0))

echo "=== test.sh: fuzz targets (libFuzzer) $(at)"
./scripts/fuzz.sh 20

configure_and_build build-asan all -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$sanitizer_flags" -DANVIEW_SANITIZE=address \
  -DCMAKE_UNITY_BUILD=ON
echo "=== test.sh: every test under ASan+UBSan $(at)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure --timeout 300 -j "$jobs"

configure_and_build build all -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=ON
echo "=== test.sh: every test, Release $(at)"
ctest --test-dir build --output-on-failure --timeout 300 -j "$jobs"
echo "=== test.sh: done $(at)"
