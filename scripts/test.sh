#!/usr/bin/env bash
# Builds Anview and runs the whole test suite:
#   1. Release build, every test (unit, launcher, multi-process and fault tests, and the
#      Python package and PyTorch backend with pytest);
#   2. ASan+UBSan build, every test;
#   3. TSan build of the unit tests (the threaded core: thread-per-rank communicators);
#   4. the fuzz targets with clang's libFuzzer, 30 s each (scripts/fuzz.sh; eight targets, two
#      at a time: 120 s).
# Tests run one at a time: the multi-process tests start several ranks each, and a 2-core
# machine has no room for two of them at once.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

configure_and_build() {  # BUILD_DIR TARGET CMAKE_ARGS...
  local dir=$1 target=$2
  shift 2
  echo "=== test.sh: building $dir ($*)"
  cmake -S . -B "$dir" -G Ninja "$@" >/dev/null
  cmake --build "$dir" -j "$jobs" --target "$target"
}

configure_and_build build-tsan anview_unit_tests -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DANVIEW_SANITIZE=thread
echo "=== test.sh: unit tests under ThreadSanitizer"
# UCX's memory hooks (libucm patches mmap/madvise for its registration cache) run inside
# exiting threads' stack teardown, where TSan's interceptors crash: off for this stage (there
# is no RDMA memory whose registrations they would keep coherent).
UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=no \
ANVIEW_LOG_LEVEL=error TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  build-tsan/bin/anview_unit_tests --gtest_brief=1

echo "=== test.sh: fuzz targets (libFuzzer)"
./scripts/fuzz.sh 30

configure_and_build build-asan all -DCMAKE_BUILD_TYPE=RelWithDebInfo -DANVIEW_SANITIZE=address
echo "=== test.sh: every test under ASan+UBSan"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure --timeout 300

configure_and_build build all -DCMAKE_BUILD_TYPE=Release
echo "=== test.sh: every test, Release"
ctest --test-dir build --output-on-failure --timeout 300
