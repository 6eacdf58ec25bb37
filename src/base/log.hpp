// Logging: one line per event on stderr, prefixed with the time (UTC, microseconds), this
// process's rank and the component that speaks:
//   [anview 09:12:39.123456 rank 3 tcp] warn: ...
// The level comes from ANVIEW_LOG_LEVEL (error, warn, info, debug, trace; default warn).
// Components: store, p2p, coll, shm, tcp, recorder, doctor (the folder or object that logs).
// Log an error once, where it starts (the layer that detects it), never again on the way up.
#pragma once

#include <sstream>
#include <string_view>

namespace anview::base {

enum class LogLevel : int { error = 0, warn = 1, info = 2, debug = 3, trace = 4 };

bool log_enabled(LogLevel level) noexcept;
void log_line(const char* component, LogLevel level, std::string_view message) noexcept;
// The rank shown in the prefix; -1 (the default) prints the pid instead.
void set_log_rank(int rank) noexcept;

template <typename... Args>
void log(const char* component, LogLevel level, const Args&... args) {
  if (!log_enabled(level)) return;
  std::ostringstream out;
  (out << ... << args);
  log_line(component, level, out.str());
}

}  // namespace anview::base
