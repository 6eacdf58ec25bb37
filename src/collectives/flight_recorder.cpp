#include "collectives/flight_recorder.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/config.hpp"
#include "base/trace.hpp"

namespace anview::collectives {
namespace {

const base::Setting recorder_setting(
    "collectives", "ANVIEW_FLIGHT_RECORDER", "1024",
    "Collectives each communicator's flight recorder remembers for its dumps (0: off)");

double seconds(base::Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

FlightRecorder::FlightRecorder()
    : FlightRecorder(
          static_cast<std::size_t>(std::max<std::int64_t>(recorder_setting.as_int(), 0))) {}

FlightRecorder::FlightRecorder(std::size_t capacity) : entries_(capacity) {}

FlightRecorder::Entry* FlightRecorder::find(std::uint64_t seq) {
  if (entries_.empty()) return nullptr;
  Entry& e = entries_[seq % entries_.size()];
  return e.seq == seq ? &e : nullptr;
}

void FlightRecorder::begin(std::uint64_t seq, const char* name, std::size_t bytes, int root) {
  if (entries_.empty()) return;
  const auto now = base::Clock::now();
  std::lock_guard lock(mu_);
  Entry& e = entries_[seq % entries_.size()];
  e.seq = seq;
  e.name = name;
  e.bytes = bytes;
  e.root = root;
  e.peer = -1;
  e.state = State::running;
  e.start = now;
  e.end = {};
  e.algorithm.clear();
  e.note.clear();
}

void FlightRecorder::algorithm(std::uint64_t seq, std::string_view algorithm) {
  std::lock_guard lock(mu_);
  if (Entry* e = find(seq)) e->algorithm = algorithm;
}

void FlightRecorder::stalled(std::uint64_t seq, int peer, const std::string& waiting_for) {
  std::lock_guard lock(mu_);
  if (Entry* e = find(seq)) {
    e->state = State::stalled;
    e->peer = peer;
    e->note = waiting_for;
  }
}

void FlightRecorder::resumed(std::uint64_t seq) {
  std::lock_guard lock(mu_);
  if (Entry* e = find(seq); e != nullptr && e->state == State::stalled) {
    e->state = State::running;
    e->note.clear();
  }
}

void FlightRecorder::failed(std::uint64_t seq, const std::string& cause) {
  std::lock_guard lock(mu_);
  if (Entry* e = find(seq); e != nullptr && e->state != State::failed) {
    e->state = State::failed;
    e->note = cause;
  }
}

void FlightRecorder::end(std::uint64_t seq, bool failed) {
  if (entries_.empty()) return;
  const auto now = base::Clock::now();
  base::Trace* trace = base::Trace::active();
  std::string name, args;
  base::Clock::time_point start;
  {
    std::lock_guard lock(mu_);
    Entry* e = find(seq);
    if (e == nullptr) return;
    e->end = now;
    if (e->state != State::failed) {
      e->state = failed ? State::failed : State::done;
      e->note = failed ? "the call threw before its algorithm ran" : "";
    }
    if (trace == nullptr) return;
    name = e->name;
    start = e->start;
    args = "\"seq\":" + std::to_string(seq) + ",\"bytes\":" + std::to_string(e->bytes);
    if (e->root >= 0) args += ",\"root\":" + std::to_string(e->root);
    if (!e->algorithm.empty()) args += ",\"algorithm\":" + base::Trace::quoted(e->algorithm);
    args += ",\"state\":\"" + std::string(to_string(e->state)) + "\"";
    if (e->state == State::failed) args += ",\"error\":" + base::Trace::quoted(e->note);
  }
  trace->add(base::Trace::Track::collectives, name, start, now, args);
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
  // Wall-clock times from the steady clock's: now on both, minus the age.
  const auto steady_now = base::Clock::now();
  const double wall_now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::lock_guard lock(mu_);
  std::vector<const Entry*> used;
  used.reserve(entries_.size());
  for (const Entry& e : entries_)
    if (e.seq != 0) used.push_back(&e);
  std::sort(used.begin(), used.end(),
            [](const Entry* a, const Entry* b) { return a->seq < b->seq; });
  auto out = nlohmann::ordered_json::array();
  for (const Entry* e : used) {
    const bool open = e->state == State::running || e->state == State::stalled;
    nlohmann::ordered_json j{{"seq", e->seq},
                             {"op", e->name},
                             {"bytes", e->bytes},
                             {"state", to_string(e->state)},
                             {"started", wall_now - seconds(steady_now - e->start)},
                             {"duration_s", seconds((open ? steady_now : e->end) - e->start)}};
    if (e->root >= 0) j["root"] = e->root;
    if (!e->algorithm.empty()) j["algorithm"] = e->algorithm;
    if (e->state == State::stalled) {
      j["waiting_for"] = e->note;
      if (e->peer >= 0) j["peer"] = e->peer;
    }
    if (e->state == State::failed) j["error"] = e->note;
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
