// Clocks and deadlines. Every blocking call in Anview takes a Deadline.
#pragma once

#include <algorithm>
#include <chrono>

namespace anview::base {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// The longest timeout: a century. A longer one (milliseconds::max() meant as "no end") added
// to now() as it is overflowed (undefined; in practice a deadline in the past, a call that
// failed at once); a century from now leaves later arithmetic on the deadline room.
inline constexpr std::chrono::milliseconds longest_timeout = std::chrono::hours(24 * 365 * 100);

inline Deadline deadline_after(std::chrono::milliseconds timeout) {
  return Clock::now() + std::min(timeout, longest_timeout);
}

// Milliseconds left until the deadline, clamped to [0, cap_ms]; for poll()/epoll_wait().
inline int ms_left(Deadline deadline, int cap_ms = 1 << 30) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > cap_ms ? cap_ms : static_cast<int>(left);
}

}  // namespace anview::base
