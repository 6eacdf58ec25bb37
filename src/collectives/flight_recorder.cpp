#include "collectives/flight_recorder.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <exception>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/config.hpp"
#include "base/ticks.hpp"
#include "base/trace.hpp"

namespace anview::collectives {
namespace {

const base::Setting recorder_setting(
    "collectives", "ANVIEW_FLIGHT_RECORDER", "1024",
    "Collectives each communicator's flight recorder remembers for its dumps, metrics and "
    "trace, rounded up to a power of two (0: off)");

constexpr auto relaxed = std::memory_order_relaxed;
// The seqlock without fences (ThreadSanitizer has none): the writer stores the fields with
// release, so a reader whose acquire load sees one of them also sees the odd version stored
// before it, and notices when it reads the version again. Plain moves on x86.
constexpr auto release = std::memory_order_release;
constexpr auto acquire = std::memory_order_acquire;

std::chrono::nanoseconds ticks_duration(std::int64_t ticks) {
  return std::chrono::nanoseconds(static_cast<std::int64_t>(base::ticks_to_ns(ticks)));
}

}  // namespace

// The writer's side of an entry's seqlock: odd version while it changes the fields (stored with
// `release`, see above).
class FlightRecorder::Writing {
 public:
  explicit Writing(Entry& e) : e_(e), version_(e.version.load(relaxed)) {
    e_.version.store(version_ + 1, relaxed);
  }
  ~Writing() { e_.version.store(version_ + 2, std::memory_order_release); }
  Writing(const Writing&) = delete;
  Writing& operator=(const Writing&) = delete;

 private:
  Entry& e_;
  std::uint64_t version_;
};

FlightRecorder::FlightRecorder()
    : FlightRecorder(
          static_cast<std::size_t>(std::max<std::int64_t>(recorder_setting.as_int(), 0))) {}

FlightRecorder::FlightRecorder(std::size_t capacity)
    : capacity_(capacity > 0 ? std::bit_ceil(capacity) : 0),
      mask_(capacity_ - 1),
      entries_(capacity > 0 ? std::make_unique<Entry[]>(capacity_) : nullptr),
      stats_(capacity > 0 ? std::make_unique<Stats[]>(max_stats) : nullptr) {
  if (capacity > 0) base::ns_per_tick();  // calibrates the ticks here, not in a call
}

void FlightRecorder::begin(std::uint64_t seq, const char* name, std::size_t bytes, int root) {
  if (capacity_ == 0) return;
  const std::int64_t now = base::ticks();
  Entry& e = entries_[seq & mask_];
  {
    Writing w(e);
    e.seq.store(seq, release);
    e.name.store(name, release);
    e.bytes.store(bytes, release);
    e.root.store(root, release);
    e.peer.store(-1, release);
    e.state.store(static_cast<std::uint8_t>(State::running), release);
    e.start_ticks.store(now, release);
    e.end_ticks.store(0, release);
    e.algorithm.store(nullptr, release);
  }
  if (has_notes_.load(relaxed) && seq > capacity_) {  // drop the notes of overwritten entries
    std::lock_guard lock(notes_mu_);
    notes_.erase(notes_.begin(), notes_.upper_bound(seq - capacity_));
    has_notes_.store(!notes_.empty(), relaxed);
  }
}

void FlightRecorder::algorithm(std::uint64_t seq, const char* algorithm) {
  Entry* e = find(seq);
  if (e == nullptr) return;
  Writing w(*e);
  e->algorithm.store(algorithm, release);
}

const char* FlightRecorder::stable_name(std::string_view name) {
  static std::mutex mu;
  static std::set<std::string, std::less<>> names;  // nodes never move: c_str() stays
  std::lock_guard lock(mu);
  auto it = names.find(name);
  if (it == names.end()) it = names.emplace(name).first;
  return it->c_str();
}

void FlightRecorder::set_note(std::uint64_t seq, const std::string& note) {
  std::lock_guard lock(notes_mu_);
  notes_[seq] = note;
  has_notes_.store(true, relaxed);
}

std::string FlightRecorder::note(std::uint64_t seq) const {
  std::lock_guard lock(notes_mu_);
  const auto it = notes_.find(seq);
  return it == notes_.end() ? std::string() : it->second;
}

void FlightRecorder::stalled(std::uint64_t seq, int peer, const std::string& waiting_for) {
  Entry* e = find(seq);
  if (e == nullptr) return;
  set_note(seq, waiting_for);
  {
    Writing w(*e);
    e->state.store(static_cast<std::uint8_t>(State::stalled), release);
    e->peer.store(peer, release);
  }
  if constexpr (base::metrics::enabled) base::metrics::bump(stats_for(*e).stalls);
}

void FlightRecorder::resumed(std::uint64_t seq) {
  Entry* e = find(seq);
  if (e == nullptr || e->state.load(relaxed) != static_cast<std::uint8_t>(State::stalled)) return;
  {
    Writing w(*e);
    e->state.store(static_cast<std::uint8_t>(State::running), release);
  }
  std::lock_guard lock(notes_mu_);
  notes_.erase(seq);
}

void FlightRecorder::failed(std::uint64_t seq, const std::string& cause) {
  Entry* e = find(seq);
  if (e == nullptr || e->state.load(relaxed) == static_cast<std::uint8_t>(State::failed)) return;
  set_note(seq, cause);
  Writing w(*e);
  e->state.store(static_cast<std::uint8_t>(State::failed), release);
}

void FlightRecorder::end(std::uint64_t seq, bool failed) {
  Entry* e = find(seq);
  if (e == nullptr) return;
  const std::int64_t now = base::ticks();
  const bool was_failed = e->state.load(relaxed) == static_cast<std::uint8_t>(State::failed);
  if (failed && !was_failed) set_note(seq, "the call threw before its algorithm ran");
  {
    Writing w(*e);
    e->end_ticks.store(now, release);
    e->state.store(static_cast<std::uint8_t>(failed || was_failed ? State::failed : State::done),
                   release);
  }
  if constexpr (base::metrics::enabled) {
    Stats& st = stats_for(*e);
    base::metrics::bump(st.calls);
    base::metrics::bump(st.bytes, e->bytes.load(relaxed));
    if (failed || was_failed) base::metrics::bump(st.failed);
    st.latency.observe(ticks_duration(now - e->start_ticks.load(relaxed)));
  }
  if (base::Trace* trace = base::Trace::active()) {
    Snapshot s;
    if (!read(*e, s)) return;
    std::string args = "\"seq\":" + std::to_string(seq) + ",\"bytes\":" + std::to_string(s.bytes);
    if (s.root >= 0) args += ",\"root\":" + std::to_string(s.root);
    if (!s.algorithm.empty()) args += ",\"algorithm\":" + base::Trace::quoted(s.algorithm);
    args += ",\"state\":\"" + std::string(to_string(s.state)) + "\"";
    if (s.state == State::failed) args += ",\"error\":" + base::Trace::quoted(note(seq));
    const auto wall_end = base::Clock::now();
    trace->add(base::Trace::Track::collectives, s.name,
               wall_end - ticks_duration(s.end_ticks - s.start_ticks), wall_end, args);
  }
}

bool FlightRecorder::read(const Entry& e, Snapshot& out) const {
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const std::uint64_t before = e.version.load(std::memory_order_acquire);
    if ((before & 1) != 0) {
      std::this_thread::yield();
      continue;
    }
    out.seq = e.seq.load(acquire);
    out.name = e.name.load(acquire);
    out.bytes = e.bytes.load(acquire);
    out.root = e.root.load(acquire);
    out.peer = e.peer.load(acquire);
    out.state = static_cast<State>(e.state.load(acquire));
    out.start_ticks = e.start_ticks.load(acquire);
    out.end_ticks = e.end_ticks.load(acquire);
    const char* algorithm = e.algorithm.load(acquire);
    if (e.version.load(acquire) != before) continue;
    out.algorithm = algorithm != nullptr ? algorithm : "";
    return out.seq != 0;
  }
  return false;  // the writer kept changing it: a dump skips the entry
}

FlightRecorder::Stats& FlightRecorder::stats_for(const Entry& e) {
  const char* name = e.name.load(relaxed);
  const char* algorithm = e.algorithm.load(relaxed);
  // Programs repeat one call: the last kind and algorithm, by their addresses, first.
  if (Stats* last = last_stats_;
      last != nullptr && last->name == name && last->algorithm == algorithm)
    return *last;
  // The same text may come from another address (a literal here, a stable_name() there).
  const auto same = [](const char* a, const char* b) {
    return a == b || (a != nullptr && b != nullptr && std::strcmp(a, b) == 0);
  };
  const std::size_t n = stats_count_.load(relaxed);  // only this thread adds
  for (std::size_t i = 0; i < n; ++i) {
    Stats& st = stats_[i];
    if (same(st.name, name) && same(st.algorithm, algorithm)) {
      last_stats_ = &st;
      return st;
    }
  }
  if (n == max_stats) return stats_[max_stats - 1];  // more kinds than ever seen: lumped
  Stats& st = stats_[n];
  st.name = name;
  st.algorithm = algorithm;
  stats_count_.store(n + 1, std::memory_order_release);
  last_stats_ = &st;
  return st;
}

void FlightRecorder::collect_metrics(base::metrics::Sink& sink,
                                     const base::metrics::Labels& labels) const {
  const std::size_t n = stats_count_.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < n; ++i) {
    const Stats& st = stats_[i];
    base::metrics::Labels l = labels;
    l.emplace_back("op", st.name);
    l.emplace_back("algorithm", st.algorithm == nullptr ? "none" : st.algorithm);
    const auto value = [](const std::atomic<std::uint64_t>& c) {
      return static_cast<double>(c.load(relaxed));
    };
    sink.counter("anview_collective_calls_total", "Collective calls ended (done or failed)", l,
                 value(st.calls));
    sink.counter("anview_collective_bytes_total", "Bytes this rank contributed to collectives", l,
                 value(st.bytes));
    sink.counter("anview_collective_errors_total", "Collective calls that failed", l,
                 value(st.failed));
    sink.counter("anview_collective_stall_reports_total",
                 "Times a collective waited past ANVIEW_WATCHDOG (hang doctor reports)", l,
                 value(st.stalls));
    sink.histogram("anview_collective_latency_seconds", "Duration of collective calls", l,
                   st.latency);
  }
}

const char* FlightRecorder::to_string(State state) {
  switch (state) {
    case State::running:
      return "running";
    case State::stalled:
      return "stalled";
    case State::done:
      return "done";
    case State::failed:
      return "failed";
  }
  return "?";
}

nlohmann::ordered_json FlightRecorder::to_json() const {
  // Wall-clock times from the ticks: now on both, minus the age.
  const std::int64_t ticks_now = base::ticks();
  const double wall_now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::vector<Snapshot> used;
  for (std::size_t i = 0; i < capacity_; ++i) {
    Snapshot s;
    if (read(entries_[i], s)) used.push_back(std::move(s));
  }
  std::sort(used.begin(), used.end(),
            [](const Snapshot& a, const Snapshot& b) { return a.seq < b.seq; });
  auto out = nlohmann::ordered_json::array();
  for (const Snapshot& s : used) {
    const bool open = s.state == State::running || s.state == State::stalled;
    nlohmann::ordered_json j{
        {"seq", s.seq},
        {"op", s.name},
        {"bytes", s.bytes},
        {"state", to_string(s.state)},
        {"started", wall_now - base::ticks_to_ns(ticks_now - s.start_ticks) * 1e-9},
        {"duration_s", base::ticks_to_ns((open ? ticks_now : s.end_ticks) - s.start_ticks) * 1e-9}};
    if (s.root >= 0) j["root"] = s.root;
    if (!s.algorithm.empty()) j["algorithm"] = s.algorithm;
    if (s.state == State::stalled) {
      j["waiting_for"] = note(s.seq);
      if (s.peer >= 0) j["peer"] = s.peer;
    }
    if (s.state == State::failed) j["error"] = note(s.seq);
    out.push_back(std::move(j));
  }
  return out;
}

Recording::Recording(FlightRecorder* recorder, std::uint64_t seq)
    : recorder_(recorder != nullptr && recorder->enabled() ? recorder : nullptr),
      seq_(seq),
      owner_(true),
      exceptions_(std::uncaught_exceptions()) {}

Recording::Recording(Recording&& other) noexcept
    : recorder_(other.recorder_),
      seq_(other.seq_),
      owner_(std::exchange(other.owner_, false)),
      exceptions_(other.exceptions_) {}

Recording& Recording::operator=(Recording&& other) noexcept {
  if (this != &other) {
    if (owner_ && recorder_ != nullptr) recorder_->end(seq_, false);
    recorder_ = other.recorder_;
    seq_ = other.seq_;
    owner_ = std::exchange(other.owner_, false);
    exceptions_ = other.exceptions_;
  }
  return *this;
}

Recording::~Recording() {
  if (owner_ && recorder_ != nullptr)
    recorder_->end(seq_, std::uncaught_exceptions() > exceptions_);
}

}  // namespace anview::collectives
