// expect_error(fn): runs fn, expects it to throw anview::Error, and returns that error so the
// test can check its kind, operation and cause.
#pragma once

#include <gtest/gtest.h>

#include "anview/error.hpp"

namespace anview::testing {

template <typename Fn>
Error expect_error(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected an anview::Error";
  return Error(ErrorKind::internal, {});
}

}  // namespace anview::testing
