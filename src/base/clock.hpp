// Clocks and deadlines. Every blocking call in Anview takes a Deadline.
#pragma once

#include <chrono>

namespace anview::base {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline Deadline deadline_after(std::chrono::milliseconds timeout) { return Clock::now() + timeout; }

// Milliseconds left until the deadline, clamped to [0, cap_ms]; for poll()/epoll_wait().
inline int ms_left(Deadline deadline, int cap_ms = 1 << 30) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > cap_ms ? cap_ms : static_cast<int>(left);
}

}  // namespace anview::base
