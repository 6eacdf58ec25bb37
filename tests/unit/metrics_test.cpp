// Metrics: histograms, the Prometheus text, and a communicator's counters through the API.
#include "base/metrics.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "anview/anview.hpp"
#include "support/thread_ranks.hpp"

namespace anview::base::metrics {
namespace {

using namespace std::chrono_literals;

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(Metrics, HistogramBucketsAndQuantiles) {
  Histogram h;
  EXPECT_EQ(h.quantile(0.5), 0);
  for (int i = 0; i < 98; ++i) h.observe(3us);  // bucket (2, 4] us
  h.observe(1ms);
  h.observe(1s);
  EXPECT_EQ(h.count(), 100u);
  EXPECT_DOUBLE_EQ(h.quantile(0.5), 4e-6);
  EXPECT_DOUBLE_EQ(h.quantile(0.99), Histogram::upper_bound(10));  // 1 ms <= 1.024 ms
  EXPECT_NEAR(h.sum(), 98 * 3e-6 + 1e-3 + 1, 1e-9);
  h.observe(10000s);  // past the last bound: the +Inf bucket
  EXPECT_EQ(h.bucket(Histogram::buckets), 1u);
}

TEST(Metrics, PrometheusTextGroupsFamiliesAndEscapes) {
  Histogram h;
  h.observe(3us);
  Group group([&](Sink& sink) {
    sink.counter("test_things_total", "Things", {{"who", "a\"b"}}, 3);
    sink.gauge("test_level", "Level", {}, 1.5);
    sink.counter("test_things_total", "Things", {{"who", "c"}}, 4);
    sink.histogram("test_seconds", "Time", {{"op", "x"}}, h);
  });
  const std::string text = prometheus_text();
  EXPECT_EQ(count_of(text, "# TYPE test_things_total counter\n"), 1u);
  EXPECT_EQ(count_of(text, "# HELP test_things_total Things\n"), 1u);
  // Both samples of the family follow its header, the quote escaped.
  const auto header = text.find("# TYPE test_things_total counter\n");
  EXPECT_EQ(text.find("test_things_total{who=\"a\\\"b\"} 3\ntest_things_total{who=\"c\"} 4\n"),
            header + std::string("# TYPE test_things_total counter\n").size());
  EXPECT_NE(text.find("test_level 1.5\n"), std::string::npos);
  EXPECT_NE(text.find("test_seconds_bucket{op=\"x\",le=\"1.9999999999999999e-06\"} 0\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("test_seconds_bucket{op=\"x\",le=\"3.9999999999999998e-06\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("test_seconds_bucket{op=\"x\",le=\"+Inf\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("test_seconds_count{op=\"x\"} 1\n"), std::string::npos);
}

TEST(Metrics, AGroupThatGoesAwayReportsNothing) {
  {
    Group group([](Sink& sink) { sink.gauge("test_gone", "Gone", {}, 1); });
    EXPECT_NE(prometheus_text().find("test_gone 1"), std::string::npos);
  }
  EXPECT_EQ(prometheus_text().find("test_gone"), std::string::npos);
}

// A communicator counts its messages and collectives; anview::metrics_json() shows them.
TEST(Metrics, CommunicatorCountsMessagesAndCollectives) {
  if constexpr (!enabled) GTEST_SKIP() << "built with ANVIEW_METRICS=OFF";
  constexpr int messages = 25;
  anview::testing::run_ranks(2, [](Communicator& comm) {
    char byte = 0;
    for (int i = 0; i < messages; ++i) {
      if (comm.rank() == 0)
        comm.send(&byte, 1, 1, Tag{3});
      else
        comm.recv(&byte, 1, 0, Tag{3});
    }
    std::vector<float> big(1 << 18);  // 1 MiB: a rendezvous, timed
    if (comm.rank() == 0)
      comm.send(big.data(), big.size() * sizeof(float), 1, Tag{4});
    else
      comm.recv(big.data(), big.size() * sizeof(float), 0, Tag{4});
    for (int i = 0; i < 3; ++i) comm.allreduce(big.data(), 16, DataType::float32, ReduceOp::sum);
    comm.barrier();
    if (comm.rank() != 1) return;
    const auto j = nlohmann::json::parse(anview::metrics_json());
    double received = -1, calls = -1;
    std::uint64_t latency_count = 0;
    for (const auto& m : j["metrics"]) {
      const auto& l = m["labels"];
      if (l.value("rank", "") != "1" || l.value("comm", "").rfind("test", 0) != 0) continue;
      if (m["name"] == "anview_p2p_messages_total" && l["peer"] == "0" &&
          l["direction"] == "received")
        received = m["value"];
      if (m["name"] == "anview_collective_calls_total" && l["op"] == "allreduce")
        calls = m["value"];
      if (m["name"] == "anview_p2p_latency_seconds" && l["direction"] == "received")
        latency_count = m["count"];
    }
    EXPECT_GE(received, messages + 1);
    EXPECT_EQ(calls, 3);
    EXPECT_GE(latency_count, 1u);  // the rendezvous-sized receive (and the tuner's probes)
  });
}

// This rank's count of point-to-point messages sent to `peer` (of a run_ranks communicator).
double sent_to(int rank, int peer) {
  const auto j = nlohmann::json::parse(anview::metrics_json());
  for (const auto& m : j["metrics"]) {
    const auto& l = m["labels"];
    if (m["name"] == "anview_p2p_messages_total" && l.value("rank", "") == std::to_string(rank) &&
        l.value("comm", "").rfind("test", 0) == 0 && l.value("peer", "") == std::to_string(peer) &&
        l.value("direction", "") == "sent")
      return m["value"];
  }
  return -1;
}

// An isend that the transport takes at once (small, the link has room) completes without a
// completion round, and used to go uncounted (and untraced): only blocking sends were.
TEST(Metrics, EveryIsendIsCountedAsSent) {
  if constexpr (!enabled) GTEST_SKIP() << "built with ANVIEW_METRICS=OFF";
  constexpr int messages = 25;
  anview::testing::run_ranks(2, [](Communicator& comm) {
    char bytes[messages] = {};
    if (comm.rank() == 0) {
      const double before = sent_to(0, 1);
      for (int i = 0; i < messages; ++i) comm.isend(&bytes[i], 1, 1, Tag{3}).wait();
      EXPECT_EQ(sent_to(0, 1), before + messages);
    } else {
      for (int i = 0; i < messages; ++i) comm.recv(&bytes[i], 1, 0, Tag{3});
    }
    comm.barrier();
  });
}

}  // namespace
}  // namespace anview::base::metrics
