#!/usr/bin/env bash
# Builds Anview and runs the whole test suite: a Release build, then an ASan+UBSan build.
# Tests run one at a time: the multi-process tests start several ranks each, and a 2-core
# machine has no room for two of them at once.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

run_suite() {  # BUILD_DIR CMAKE_ARGS...
  local dir=$1
  shift
  echo "=== test.sh: building $dir ($*)"
  cmake -S . -B "$dir" -G Ninja "$@" >/dev/null
  cmake --build "$dir" -j "$jobs"
  echo "=== test.sh: testing $dir"
  ctest --test-dir "$dir" --output-on-failure --timeout 300
}

run_suite build -DCMAKE_BUILD_TYPE=Release
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_suite build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DANVIEW_SANITIZE=address
