// Metrics, Seastar-style: an object keeps plain counters next to the state they describe and
// registers a Group whose collect function reports them when someone asks (a Prometheus
// scrape, Anview's JSON). Counting costs an increment where the object already holds its lock;
// nothing is formatted or allocated until a scrape. A build with ANVIEW_METRICS=OFF compiles
// the counting out (`metrics_enabled`), to show what it costs.
//
// Families: counters end in _total; histograms are of seconds, with power-of-two buckets from
// 1 microsecond to about 67 s.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "base/clock.hpp"

namespace anview::base::metrics {

#ifdef ANVIEW_NO_METRICS
inline constexpr bool enabled = false;
#else
inline constexpr bool enabled = true;
#endif

using Labels = std::vector<std::pair<std::string, std::string>>;

// Written by one thread (its owner's), read by a scrape on another: relaxed atomics, each
// increment a plain load and store (no locked instruction).
class Histogram {
 public:
  static constexpr int buckets = 27;  // upper bounds 1 us * 2^i
  static double upper_bound(int i);   // seconds

  void observe(Clock::duration d);
  // Quantile `q` (0..1) estimated from the buckets (the bucket's upper bound); 0 when empty.
  double quantile(double q) const;
  std::uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const { return static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9; }
  // Observations in bucket `i` alone (i == buckets: above the last bound).
  std::uint64_t bucket(int i) const {
    return counts_[static_cast<std::size_t>(i)].load(std::memory_order_relaxed);
  }

 private:
  std::array<std::atomic<std::uint64_t>, buckets + 1> counts_{};
  std::atomic<std::uint64_t> count_{0};
  std::atomic<std::uint64_t> sum_ns_{0};
};

// One writer's increment of a counter others read.
inline void bump(std::atomic<std::uint64_t>& counter, std::uint64_t n = 1) {
  counter.store(counter.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

// What a Group's collect function reports to.
class Sink {
 public:
  virtual ~Sink() = default;
  virtual void counter(const char* name, const char* help, const Labels& labels, double value) = 0;
  virtual void gauge(const char* name, const char* help, const Labels& labels, double value) = 0;
  virtual void histogram(const char* name, const char* help, const Labels& labels,
                         const Histogram& h) = 0;
};

// Registers `collect` while it lives. collect runs on the scraping thread; it takes the locks
// its counters need. Destruction waits for a collect in progress.
class Group {
 public:
  using Collect = std::function<void(Sink&)>;
  Group() = default;
  explicit Group(Collect collect);
  Group(Group&& other) noexcept : id_(std::exchange(other.id_, 0)) {}
  Group& operator=(Group&& other) noexcept;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  ~Group();

 private:
  std::uint64_t id_ = 0;
};

// Every registered group's metrics, reported to `sink`.
void collect_all(Sink& sink);

// The Prometheus text exposition format (version 0.0.4) of everything registered.
std::string prometheus_text();

}  // namespace anview::base::metrics
