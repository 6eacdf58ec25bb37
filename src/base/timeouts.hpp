// Default deadlines: the one setting every blocking call falls back to when its caller gives
// no timeout (stores, connects, waits).
#pragma once

#include <chrono>
#include <optional>

#include "base/config.hpp"

namespace anview::base {

// ANVIEW_TIMEOUT: default deadline of every blocking call (default 300 s). Read it with
// `timeout_setting().as_duration()`; a malformed value raises a usage Error naming it.
// Do not call during static initialisation of another translation unit.
const Setting& timeout_setting();
// `requested` where it is positive, else ANVIEW_TIMEOUT: how callers resolve "no timeout given".
std::chrono::milliseconds timeout_or_default(std::chrono::milliseconds requested);
// For a public optional timeout: none means ANVIEW_TIMEOUT; a given one is kept, and zero (or a
// negative remainder) means poll.
std::chrono::milliseconds timeout_or_default(std::optional<std::chrono::milliseconds> requested);
// ANVIEW_WATCHDOG: how long a wait goes before the hang doctor speaks (default 60 s; 0: off).
const Setting& watchdog_setting();

}  // namespace anview::base
