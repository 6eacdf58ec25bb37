// A test's helper thread. It is joined when it goes out of scope, also while an exception
// leaves the test, and an exception it raises is a test failure: neither ends the test binary
// in std::terminate, which names no test and loses gtest's buffered output.
#pragma once

#include <exception>
#include <thread>
#include <utility>

#include <gtest/gtest.h>

namespace anview::testing {

template <class Fn>
std::jthread test_thread(Fn fn) {
  return std::jthread([fn = std::move(fn)]() mutable {
    try {
      fn();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "a test thread raised: " << e.what();
    }
  });
}

}  // namespace anview::testing
