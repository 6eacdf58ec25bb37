// Clocks and deadlines. Every blocking call in Anview takes a Deadline.
#pragma once

#include <algorithm>
#include <chrono>

namespace anview::base {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// A timeout too long for the clock (milliseconds::max() meant as "no end") saturates at a
// century from now, which later arithmetic on the deadline still has room for: added as it is,
// it overflowed (undefined; in practice a deadline in the past, a call that failed at once).
inline Deadline deadline_after(std::chrono::milliseconds timeout) {
  constexpr std::chrono::milliseconds century = std::chrono::hours(24 * 365 * 100);
  return Clock::now() + std::min(timeout, century);
}

// Milliseconds left until the deadline, clamped to [0, cap_ms]; for poll()/epoll_wait().
inline int ms_left(Deadline deadline, int cap_ms = 1 << 30) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > cap_ms ? cap_ms : static_cast<int>(left);
}

}  // namespace anview::base
