// The flight recorder: a bounded ring of a communicator's latest collectives
// (ANVIEW_FLIGHT_RECORDER entries, default 1024; 0: off). Each entry says what the call was
// (sequence number, kind, bytes, root, algorithm), when it started and ended, and how it stands:
// running, stalled (waiting past the watchdog interval, for whom and what), done or failed (and
// why). The core dumps it as JSON on errors, on the hang doctor's reports, on SIGUSR1 and on
// request.
//
// The collectives' thread writes it; a dump reads it from another thread, so every access
// takes the mutex (uncontended: a few tens of nanoseconds per call).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/clock.hpp"

namespace anview::collectives {

class FlightRecorder {
 public:
  enum class State : std::uint8_t { running, stalled, done, failed };

  // Reads ANVIEW_FLIGHT_RECORDER.
  FlightRecorder();
  explicit FlightRecorder(std::size_t capacity);

  bool enabled() const { return !entries_.empty(); }

  // A call began (`seq` grows by one per call of the communicator).
  void begin(std::uint64_t seq, const char* name, std::size_t bytes, int root);
  void algorithm(std::uint64_t seq, std::string_view algorithm);
  // Waiting past the watchdog interval for communicator rank `peer` (-1: several or unknown).
  void stalled(std::uint64_t seq, int peer, const std::string& waiting_for);
  void resumed(std::uint64_t seq);
  void failed(std::uint64_t seq, const std::string& cause);
  // The call returned (or threw: `failed` unless a cause was recorded already).
  void end(std::uint64_t seq, bool failed);

  // The entries, oldest first: [{"seq", "op", "bytes", "root", "algorithm", "state",
  // "started" (seconds since the epoch), "duration_s" (so far, while running), "peer",
  // "waiting_for" / "error"}].
  nlohmann::ordered_json to_json() const;

  static const char* to_string(State state);

 private:
  struct Entry {
    std::uint64_t seq = 0;  // 0: never used
    const char* name = "";
    std::size_t bytes = 0;
    int root = -1;
    int peer = -1;
    State state = State::running;
    base::Clock::time_point start{};
    base::Clock::time_point end{};
    std::string algorithm;
    std::string note;  // what a stalled call waits for, or why a call failed
  };
  // The entry of `seq` while the ring still holds it, else null (mu_ held).
  Entry* find(std::uint64_t seq);

  mutable std::mutex mu_;
  std::vector<Entry> entries_;
};

// A call's handle on its entry (a member of Call): the call that began owns it and ends the
// entry when it goes away, as failed when an exception unwinds it. Copies (a subgroup's view of
// the same call) record through it but do not end it.
class Recording {
 public:
  Recording() = default;
  Recording(FlightRecorder* recorder, std::uint64_t seq);
  Recording(const Recording& other) noexcept : recorder_(other.recorder_), seq_(other.seq_) {}
  Recording(Recording&& other) noexcept;
  Recording& operator=(const Recording&) = delete;
  Recording& operator=(Recording&& other) noexcept;
  ~Recording();

  void algorithm(std::string_view name) const {
    if (recorder_ != nullptr) recorder_->algorithm(seq_, name);
  }
  void stalled(int peer, const std::string& waiting_for) const {
    if (recorder_ != nullptr) recorder_->stalled(seq_, peer, waiting_for);
  }
  void resumed() const {
    if (recorder_ != nullptr) recorder_->resumed(seq_);
  }
  void failed(const std::string& cause) const {
    if (recorder_ != nullptr) recorder_->failed(seq_, cause);
  }

 private:
  FlightRecorder* recorder_ = nullptr;
  std::uint64_t seq_ = 0;
  bool owner_ = false;
  int exceptions_ = 0;  // uncaught exceptions when the call began
};

}  // namespace anview::collectives
