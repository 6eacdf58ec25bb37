// The flight recorder: a bounded ring of a communicator's latest collectives
// (ANVIEW_FLIGHT_RECORDER entries rounded up to a power of two, default 1024; 0: off, and with it
// the collectives' metrics and trace events). Each entry says what the call was (sequence number,
// kind, bytes, root, algorithm), when it started and ended, and how it stands: running, stalled
// (waiting past the watchdog interval, for whom and what), done or failed (and why). The core dumps
// it as JSON on errors, on the hang doctor's reports, on SIGUSR1 and on request.
//
// One thread writes it (the communicator's collectives run one at a time); a dump or a metrics
// scrape reads it from another. A call costs two reads of base::ticks() (the TSC where it is
// invariant) and plain stores: each entry is a seqlock of atomics (a reader retries while the
// writer is inside), and the texts of the rare stalled and failed calls sit in a small map
// under a mutex.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/clock.hpp"
#include "base/metrics.hpp"

namespace anview::collectives {

class FlightRecorder {
 public:
  enum class State : std::uint8_t { running, stalled, done, failed };

  // Reads ANVIEW_FLIGHT_RECORDER.
  FlightRecorder();
  explicit FlightRecorder(std::size_t capacity);

  bool enabled() const { return capacity_ > 0; }

  // A call began (`seq` grows by one per call of the communicator).
  void begin(std::uint64_t seq, const char* name, std::size_t bytes, int root);
  // The algorithm it runs: a name that lives as long as the process (a string literal, or
  // stable_name()'s), stored as its address.
  void algorithm(std::uint64_t seq, const char* algorithm);
  // `name`'s copy that lives as long as the process (the same address for the same text).
  // Takes a lock: for names that are then used many times.
  static const char* stable_name(std::string_view name);
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

  // Metrics of the calls ended so far, per kind and algorithm: calls, bytes, failures, stall
  // reports and a latency histogram (metrics.hpp), each with `labels`.
  void collect_metrics(base::metrics::Sink& sink, const base::metrics::Labels& labels) const;

 private:
  struct Entry {
    std::atomic<std::uint64_t> version{0};  // odd while the writer is changing the entry
    std::atomic<std::uint64_t> seq{0};      // 0: never used
    std::atomic<const char*> name{""};      // a string literal
    std::atomic<std::uint64_t> bytes{0};
    std::atomic<std::int32_t> root{-1};
    std::atomic<std::int32_t> peer{-1};
    std::atomic<std::uint8_t> state{0};
    std::atomic<std::int64_t> start_ticks{0};  // base::ticks()
    std::atomic<std::int64_t> end_ticks{0};
    std::atomic<const char*> algorithm{nullptr};  // null: not chosen (yet)
  };
  // What a reader copies out of an entry.
  struct Snapshot {
    std::uint64_t seq;
    const char* name;
    std::uint64_t bytes;
    int root, peer;
    State state;
    std::int64_t start_ticks, end_ticks;
    std::string algorithm;
  };
  // The writer's side of the seqlock.
  class Writing;

  // The entry of `seq` while the ring holds it, else null.
  Entry* find(std::uint64_t seq) {
    if (capacity_ == 0) return nullptr;
    Entry& e = entries_[seq & mask_];
    return e.seq.load(std::memory_order_relaxed) == seq ? &e : nullptr;
  }
  bool read(const Entry& e, Snapshot& out) const;  // false: unused or changed meanwhile
  void set_note(std::uint64_t seq, const std::string& note);
  std::string note(std::uint64_t seq) const;

  struct Stats {
    const char* name = "";            // a string literal
    const char* algorithm = nullptr;  // as stored in entries (null: none)
    std::atomic<std::uint64_t> calls{0}, bytes{0}, failed{0}, stalls{0};
    base::metrics::Histogram latency;
  };
  // The writer's: the entry's kind and algorithm (read without the seqlock: it wrote them).
  Stats& stats_for(const Entry& e);

  std::size_t capacity_;  // a power of two (or 0)
  std::size_t mask_;      // capacity_ - 1: an entry's index without a division per call
  std::unique_ptr<Entry[]> entries_;
  // Notes (what a stalled call waits for, why a call failed) by seq, of entries still held.
  mutable std::mutex notes_mu_;
  std::map<std::uint64_t, std::string> notes_;
  std::atomic<bool> has_notes_{false};
  // Per kind and algorithm: published by `stats_count_` (release), never moved.
  static constexpr std::size_t max_stats = 64;
  std::unique_ptr<Stats[]> stats_;
  std::atomic<std::size_t> stats_count_{0};
  Stats* last_stats_ = nullptr;  // programs repeat one call: checked first
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

  void algorithm(const char* name) const {
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
