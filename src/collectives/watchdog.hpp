// The hang doctor's hook in the collectives: a step that has waited past the watchdog interval
// (ANVIEW_WATCHDOG, default 60 s; 0 turns it off) tells the communicator's StallReporter, which
// compares notes with the other ranks and says who is stuck, long before the call's timeout.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "base/clock.hpp"

namespace anview::collectives {

struct Call;

class StallReporter {
 public:
  virtual ~StallReporter() = default;
  // `call` has waited `waited` in one step for communicator rank `peer` (-1: several or
  // unknown); `waiting_for` says what is missing. Called on the waiting thread, once per
  // interval of waiting; must not throw.
  virtual void stalled(const Call& call, std::chrono::milliseconds waited, int peer,
                       const std::string& waiting_for) noexcept = 0;
  // The wait that was reported as stalled is over (completed or failed).
  virtual void resumed(const Call& call) noexcept = 0;
};

// The watchdog interval from ANVIEW_WATCHDOG (zero: off); read once per communicator.
std::chrono::milliseconds watchdog_interval();

// One wait measured against the interval: check() reports through the call's reporter each
// time another interval has passed.
class StallClock {
 public:
  // `start`: when the wait began (the caller has read the clock already).
  StallClock(const Call& call, base::Clock::time_point start);
  ~StallClock();  // tells the reporter the wait is over, if it reported it
  StallClock(const StallClock&) = delete;
  StallClock& operator=(const StallClock&) = delete;
  // `waiting_for` is only built when a report is due.
  void check(int peer, const std::function<std::string()>& waiting_for);

 private:
  const Call& call_;
  base::Clock::time_point start_;
  base::Clock::time_point next_;
  bool armed_;
  bool reported_ = false;
};

}  // namespace anview::collectives
