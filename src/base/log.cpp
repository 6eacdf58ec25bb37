#include "base/log.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <string>

#include "base/config.hpp"

namespace anview::base {
namespace {

const Setting log_level_setting("base", "ANVIEW_LOG_LEVEL", "warn",
                                "Least severe message printed: error, warn, info, debug, trace");

std::atomic<int> g_rank{-1};

int configured_level() {
  static const int level = [] {
    const std::string v = log_level_setting.value();
    const char* names[] = {"error", "warn", "info", "debug", "trace"};
    for (int i = 0; i < 5; ++i)
      if (v == names[i]) return i;
    std::fprintf(stderr,
                 "[anview] warn: ANVIEW_LOG_LEVEL='%s' is not one of error, warn, info, "
                 "debug, trace; using warn\n",
                 v.c_str());
    return 1;
  }();
  return level;
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::error:
      return "error";
    case LogLevel::warn:
      return "warn";
    case LogLevel::info:
      return "info";
    case LogLevel::debug:
      return "debug";
    case LogLevel::trace:
      return "trace";
  }
  return "?";
}

}  // namespace

bool log_enabled(LogLevel level) noexcept {
  return static_cast<int>(level) <= configured_level();
}

void set_log_rank(int rank) noexcept {
  g_rank.store(rank, std::memory_order_relaxed);
}

void log_line(const char* component, LogLevel level, std::string_view message) noexcept {
  const int rank = g_rank.load(std::memory_order_relaxed);
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  tm utc{};
  ::gmtime_r(&now.tv_sec, &utc);
  char time[32];
  std::snprintf(time, sizeof time, "%02d:%02d:%02d.%06ld", utc.tm_hour, utc.tm_min, utc.tm_sec,
                now.tv_nsec / 1000);
  std::string line = "[anview ";
  line += time;
  line += rank >= 0 ? " rank " + std::to_string(rank) : " pid " + std::to_string(::getpid());
  line += ' ';
  line += component;
  line += "] ";
  line += level_name(level);
  line += ": ";
  line += message;
  line += '\n';
  // One write per line so lines from several threads or ranks do not interleave.
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace anview::base
