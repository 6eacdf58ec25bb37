// Linked into the unit-test binary: a std::terminate names the test it ended and where it was
// called from. Without it, an abort ("terminate called without an active exception", e.g. a
// joinable std::thread destroyed) says neither: the runtime's message has no stack, and a
// run with --gtest_brief prints no test names.
#include <execinfo.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include <gtest/gtest.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#include <sanitizer/common_interface_defs.h>
#define ANVIEW_SANITIZER_STACK 1
#endif

namespace {

void report_and_abort() {
  std::fflush(stdout);  // gtest's lines first, when both go to one file
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  std::fprintf(stderr, "=== std::terminate in test %s.%s\n", test ? test->test_suite_name() : "?",
               test ? test->name() : "(none)");
  if (const std::exception_ptr active = std::current_exception()) {
    try {
      std::rethrow_exception(active);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "=== with the exception: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "=== with an exception that is no std::exception\n");
    }
  } else {
    std::fprintf(stderr,
                 "=== with no exception in flight (e.g. a joinable std::thread "
                 "destroyed, or terminate() called)\n");
  }
#ifdef ANVIEW_SANITIZER_STACK
  __sanitizer_print_stack_trace();  // symbolized
#else
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
#endif
  std::abort();
}

[[maybe_unused]] const bool installed = (std::set_terminate(report_and_abort), true);

}  // namespace
