#include "collectives/watchdog.hpp"

#include "base/timeouts.hpp"
#include "collectives/algorithms.hpp"

namespace anview::collectives {

std::chrono::milliseconds watchdog_interval() {
  return base::watchdog_setting().as_duration();
}

StallClock::StallClock(const Call& call, base::Clock::time_point start)
    : call_(call),
      start_(start),
      next_(start_ + call.watchdog),
      armed_(call.reporter != nullptr && call.watchdog.count() > 0) {}

StallClock::~StallClock() {
  if (!reported_) return;
  call_.record.resumed();
  call_.reporter->resumed(call_);
}

void StallClock::check(int peer, const std::function<std::string()>& waiting_for) {
  if (!armed_) return;
  const auto now = base::Clock::now();
  if (now < next_) return;
  next_ = now + call_.watchdog;
  reported_ = true;
  const std::string what = waiting_for();
  call_.record.stalled(peer, what);
  call_.reporter->stalled(
      call_, std::chrono::duration_cast<std::chrono::milliseconds>(now - start_), peer, what);
}

}  // namespace anview::collectives
