// Logging: one line per event on stderr, prefixed with this process's rank.
// The level comes from ANVIEW_LOG_LEVEL (error, warn, info, debug, trace; default warn).
// Log an error once, where it starts (the layer that detects it), never again on the way up.
#pragma once

#include <sstream>
#include <string_view>

namespace anview::base {

enum class LogLevel : int { error = 0, warn = 1, info = 2, debug = 3, trace = 4 };

bool log_enabled(LogLevel level) noexcept;
void log_line(LogLevel level, std::string_view message) noexcept;
// The rank shown in the prefix; -1 (the default) prints the pid instead.
void set_log_rank(int rank) noexcept;

template <typename... Args>
void log(LogLevel level, const Args&... args) {
  if (!log_enabled(level)) return;
  std::ostringstream out;
  (out << ... << args);
  log_line(level, out.str());
}

}  // namespace anview::base
