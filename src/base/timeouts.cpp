#include "base/timeouts.hpp"

#include <algorithm>

#include "base/clock.hpp"

namespace anview::base {
namespace {

const Setting timeout(
    "base", "ANVIEW_TIMEOUT", "300",
    "Default deadline of every blocking call (seconds; ms/us/m suffixes allowed)");

const Setting watchdog(
    "base", "ANVIEW_WATCHDOG", "60s",
    "When a collective or a blocking send/receive has waited this long, say who it waits for "
    "(collectives: the ranks compare notes through the store) and dump the flight recorder "
    "(0: off)");

}  // namespace

const Setting& timeout_setting() {
  return timeout;
}

// Capped at longest_timeout: callers add them to now() (clock.hpp).
std::chrono::milliseconds timeout_or_default(std::chrono::milliseconds requested) {
  return requested.count() > 0 ? std::min(requested, longest_timeout) : timeout.as_duration();
}

std::chrono::milliseconds timeout_or_default(std::optional<std::chrono::milliseconds> requested) {
  return requested ? std::clamp(*requested, std::chrono::milliseconds(0), longest_timeout)
                   : timeout.as_duration();
}

const Setting& watchdog_setting() {
  return watchdog;
}

}  // namespace anview::base
