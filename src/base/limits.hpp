// Limits against broken and hostile peers (SECURITY.md, "Limits"). Each is a setting with a
// safe default; components read it when they start. Exceeding one closes the connection that
// did, with a logged reason; the process and the job go on.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "base/clock.hpp"

namespace anview::base::limits {

// ANVIEW_MAX_FRAME: the largest frame payload a transport accepts (default 64 MiB, 64 KiB to
// 1 GiB). Senders cut rendezvous chunks and eager messages to fit it.
std::uint32_t max_frame_bytes();
// ANVIEW_HANDSHAKE_TIMEOUT: how long an accepted connection may take to prove who it is (its
// handshake on a data port, its first request or its authentication on the store; default 10 s).
std::chrono::milliseconds handshake_timeout();
// ANVIEW_MAX_PENDING_CONNECTIONS: connections a listener holds that have not finished their
// handshake (default 128). One more makes the listener drop the oldest of them.
std::size_t max_pending_connections();

// Logging of dropped connections, bounded under a flood: the first `burst` drops of each
// `interval` are logged, the rest only counted; the next logged line tells how many were not.
class DropLog {
 public:
  explicit DropLog(std::chrono::milliseconds interval = std::chrono::seconds(10), int burst = 10)
      : interval_(interval), burst_(burst) {}

  // Logs `line` at warn for `component` (e.g. "tcp") unless the burst of this interval is
  // spent. Returns whether it was logged.
  bool log(const char* component, const std::string& line);
  std::uint64_t suppressed() const { return suppressed_total_; }

 private:
  std::chrono::milliseconds interval_;
  int burst_;
  Clock::time_point window_start_{};
  int logged_in_window_ = 0;
  std::uint64_t suppressed_since_logged_ = 0;
  std::uint64_t suppressed_total_ = 0;
};

}  // namespace anview::base::limits
