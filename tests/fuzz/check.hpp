// FUZZ_CHECK: an invariant of a fuzz target. A violation prints what failed and aborts, which
// libFuzzer records as a crash (with the input that caused it) and the replay test reports as
// a failure.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(condition)                                                                     \
  do {                                                                                            \
    if (!(condition)) {                                                                           \
      std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, __LINE__, #condition); \
      std::abort();                                                                               \
    }                                                                                             \
  } while (false)
