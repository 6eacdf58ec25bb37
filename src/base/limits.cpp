#include "base/limits.hpp"

#include "anview/error.hpp"
#include "base/config.hpp"
#include "base/log.hpp"

namespace anview::base::limits {
namespace {

const Setting max_frame_setting(
    "limits", "ANVIEW_MAX_FRAME", "64M",
    "Largest frame payload a transport accepts (64K..1G); a peer announcing more is dropped");
const Setting handshake_setting(
    "limits", "ANVIEW_HANDSHAKE_TIMEOUT", "10s",
    "Time an accepted connection has to finish its handshake (data ports) or its first request "
    "and authentication (store) before it is dropped");
const Setting pending_setting(
    "limits", "ANVIEW_MAX_PENDING_CONNECTIONS", "128",
    "Connections a listener holds before their handshake is done; beyond it the oldest is "
    "dropped");

}  // namespace

std::uint32_t max_frame_bytes() {
  return static_cast<std::uint32_t>(max_frame_setting.as_int_in(64 << 10, std::int64_t{1} << 30));
}

std::chrono::milliseconds handshake_timeout() {
  const auto t = handshake_setting.as_duration();
  if (t.count() < 1 || t > std::chrono::hours(1)) {
    throw Error(ErrorKind::usage,
                {.operation = "config",
                 .cause = std::string("ANVIEW_HANDSHAKE_TIMEOUT='") + handshake_setting.value() +
                          "' is out of range (1 ms to 1 h)"});
  }
  return t;
}

std::size_t max_pending_connections() {
  return static_cast<std::size_t>(pending_setting.as_int_in(1, 1 << 20));
}

bool DropLog::log(const char* component, const std::string& line) {
  const auto now = Clock::now();
  if (now - window_start_ >= interval_) {
    window_start_ = now;
    logged_in_window_ = 0;
  }
  if (logged_in_window_ >= burst_) {
    ++suppressed_since_logged_;
    ++suppressed_total_;
    return false;
  }
  ++logged_in_window_;
  if (suppressed_since_logged_ == 0) {
    base::log(component, LogLevel::warn, line);
  } else {
    base::log(component, LogLevel::warn, line, " (", suppressed_since_logged_,
              " similar drops before it were not logged)");
    suppressed_since_logged_ = 0;
  }
  return true;
}

}  // namespace anview::base::limits
