// ANVIEW_TRACE=FILE: a Chrome trace-event JSON file (it loads in Perfetto and chrome://tracing)
// with one track (process) per rank. Level "ops" (ANVIEW_TRACE_DETAIL, the default) records each
// collective as a complete event (name, sequence number, bytes, algorithm, state) on the
// rank's "collectives" thread; level "transfers" adds every point-to-point send and receive
// (peer, tag, bytes) on its "p2p" thread.
//
// Events collect in memory (at most ANVIEW_TRACE_EVENTS per process, then counted as dropped)
// and go to the file when the process's last communicator closes. The ranks of a job share
// the file: each takes an exclusive lock on it and adds its events, so the file stays one valid
// JSON document; a file left by another job (another job id) is replaced. Ranks on hosts that
// do not share the file's folder each write their own.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "base/clock.hpp"

namespace anview::base {

class Trace {
 public:
  enum class Track : int { collectives = 1, p2p = 2 };

  // The process's trace, or null when ANVIEW_TRACE is not set (read once).
  static Trace* active();
  bool transfers() const { return transfers_; }

  // A communicator opens: the first one names the job (its id) and the rank of this process's
  // track. close() after the last one writes the events to the file.
  void open(std::uint64_t job_id, int rank);
  void close();

  // One complete event. `args` is a JSON object's members, already rendered ("\"bytes\":8").
  void add(Track track, std::string_view name, Clock::time_point start, Clock::time_point end,
           std::string_view args);

  // `text` as a JSON string literal, quotes included.
  static std::string quoted(std::string_view text);

  // Writes `events` (rendered, comma-separated) for `job_id` into `path` under an exclusive
  // lock: appended to the same job's events, or replacing another job's file. Exposed for tests.
  static void merge_into(const std::string& path, std::uint64_t job_id, const std::string& events);

 private:
  Trace(std::string path, bool transfers, std::size_t limit);
  void flush();  // mu_ held

  const std::string path_;
  const bool transfers_;
  const std::size_t limit_;
  // Steady clock to microseconds since the epoch.
  const Clock::time_point steady_origin_;
  const double wall_origin_us_;

  std::mutex mu_;
  int open_ = 0;
  std::uint64_t job_id_ = 0;
  int rank_ = -1;
  std::vector<std::string> events_;
  std::size_t dropped_ = 0;
};

}  // namespace anview::base
