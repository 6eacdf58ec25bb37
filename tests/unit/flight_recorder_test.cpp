// The flight recorder: what a call leaves in it (unit), and a communicator's dump_state().
#include "collectives/flight_recorder.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>

#include "anview/anview.hpp"
#include "support/expect_error.hpp"
#include "support/thread_ranks.hpp"

namespace anview::collectives {
namespace {

TEST(FlightRecorder, RecordsACallFromBeginToEnd) {
  FlightRecorder recorder(8);
  {
    Recording record(&recorder, 1);
    recorder.begin(1, "allreduce", 4096, -1);
    record.algorithm("ring");
    const auto running = recorder.to_json();
    ASSERT_EQ(running.size(), 1u);
    EXPECT_EQ(running[0]["state"], "running");
    record.stalled(3, "its part of the call has not arrived");
    const auto stalled = recorder.to_json()[0];
    EXPECT_EQ(stalled["state"], "stalled");
    EXPECT_EQ(stalled["peer"], 3);
    EXPECT_EQ(stalled["waiting_for"], "its part of the call has not arrived");
    record.resumed();
    EXPECT_EQ(recorder.to_json()[0]["state"], "running");
  }
  const auto done = recorder.to_json()[0];
  EXPECT_EQ(done["seq"], 1);
  EXPECT_EQ(done["op"], "allreduce");
  EXPECT_EQ(done["bytes"], 4096);
  EXPECT_EQ(done["algorithm"], "ring");
  EXPECT_EQ(done["state"], "done");
  EXPECT_FALSE(done.contains("root"));
  EXPECT_GE(done["duration_s"].get<double>(), 0.0);
  EXPECT_GT(done["started"].get<double>(), 1.7e9);  // seconds since the epoch, not uptime
}

TEST(FlightRecorder, AnExceptionMarksTheCallFailedWithItsCause) {
  FlightRecorder recorder(8);
  recorder.begin(1, "broadcast", 8, 2);
  recorder.begin(2, "barrier", 0, -1);
  try {
    Recording record(&recorder, 1);
    record.failed("peer 2 lost");
    throw std::runtime_error("unwinding");
  } catch (const std::runtime_error&) {
  }
  try {
    Recording record(&recorder, 2);
    throw std::runtime_error("unwinding");  // no cause recorded
  } catch (const std::runtime_error&) {
  }
  const auto j = recorder.to_json();
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["state"], "failed");
  EXPECT_EQ(j[0]["error"], "peer 2 lost");
  EXPECT_EQ(j[0]["root"], 2);
  EXPECT_EQ(j[1]["state"], "failed");
  EXPECT_FALSE(j[1]["error"].get<std::string>().empty());
}

TEST(FlightRecorder, KeepsTheLatestCallsOldestFirst) {
  FlightRecorder recorder(4);
  for (std::uint64_t seq = 1; seq <= 10; ++seq) {
    recorder.begin(seq, "allreduce", seq, -1);
    Recording(&recorder, seq);  // ends at once
  }
  const auto j = recorder.to_json();
  ASSERT_EQ(j.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(j[i]["seq"], 7 + i);
  // An entry the ring has overwritten is not touched by its late handle.
  recorder.failed(3, "late");
  for (const auto& e : recorder.to_json()) EXPECT_EQ(e["state"], "done");
}

TEST(FlightRecorder, CopiesOfACallDoNotEndIt) {
  FlightRecorder recorder(4);
  recorder.begin(1, "allreduce", 8, -1);
  {
    Recording owner(&recorder, 1);
    { Recording copy(owner); }  // a subgroup's view of the call going away
    EXPECT_EQ(recorder.to_json()[0]["state"], "running");
  }
  EXPECT_EQ(recorder.to_json()[0]["state"], "done");
}

// A dump taken while calls run reads each entry whole: never one call's bytes with another's
// algorithm (the entries are seqlocks).
TEST(FlightRecorder, ADumpDuringCallsSeesWholeEntries) {
  FlightRecorder recorder(16);
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> calls{0};
  std::jthread writer([&] {
    for (std::uint64_t seq = 1; !stop.load(std::memory_order_relaxed); ++seq) {
      recorder.begin(seq, "allreduce", seq * 8, -1);
      Recording record(&recorder, seq);
      record.algorithm(seq % 2 == 0 ? "ring" : "recursive_doubling");
      calls.store(seq, std::memory_order_relaxed);
    }
  });
  while (calls.load(std::memory_order_relaxed) < 100) std::this_thread::yield();
  int entries = 0;
  for (int dump = 0; dump < 300; ++dump) {
    for (const auto& e : recorder.to_json()) {
      const auto seq = e["seq"].get<std::uint64_t>();
      ASSERT_EQ(e["bytes"].get<std::uint64_t>(), seq * 8);
      if (e.contains("algorithm")) {
        ASSERT_EQ(e["algorithm"], seq % 2 == 0 ? "ring" : "recursive_doubling");
      }
      ++entries;
    }
  }
  stop = true;
  writer.join();
  EXPECT_GT(entries, 0);
}

TEST(FlightRecorder, HoldsAPowerOfTwoOfCalls) {
  FlightRecorder recorder(5);  // rounded up to 8: an entry's index is a mask, not a division
  for (std::uint64_t seq = 1; seq <= 20; ++seq) {
    recorder.begin(seq, "barrier", 0, -1);
    Recording(&recorder, seq);
  }
  const auto j = recorder.to_json();
  ASSERT_EQ(j.size(), 8u);
  EXPECT_EQ(j.front()["seq"], 13);
  EXPECT_EQ(j.back()["seq"], 20);
}

TEST(FlightRecorder, StableNamesAreOneCopyPerText) {
  const std::string ring = "ring";
  const char* a = FlightRecorder::stable_name(ring);
  const char* b = FlightRecorder::stable_name(std::string_view("ringing").substr(0, 4));
  EXPECT_EQ(a, b);
  EXPECT_STREQ(a, "ring");
  EXPECT_NE(a, ring.c_str());
  EXPECT_NE(FlightRecorder::stable_name("recursive_doubling"), a);
}

// The algorithm is kept as an address; the metrics count by text, so a literal and a stable
// copy of the same name are one series.
TEST(FlightRecorder, MetricsCountOneSeriesPerKindAndAlgorithmText) {
  struct Collect final : base::metrics::Sink {
    std::map<std::string, double> calls;  // "op/algorithm"
    void counter(const char* name, const char*, const base::metrics::Labels& labels,
                 double value) override {
      if (std::string(name) != "anview_collective_calls_total") return;
      std::string key;
      for (const auto& [k, v] : labels) key += (key.empty() ? "" : "/") + v;
      calls[key] += value;
    }
    void gauge(const char*, const char*, const base::metrics::Labels&, double) override {}
    void histogram(const char*, const char*, const base::metrics::Labels&,
                   const base::metrics::Histogram&) override {}
  };
  FlightRecorder recorder(8);
  const char* algorithms[] = {"ring", FlightRecorder::stable_name("ring"), "ring", nullptr};
  std::uint64_t seq = 0;
  for (const char* algorithm : algorithms) {
    recorder.begin(++seq, "allreduce", 8, -1);
    Recording record(&recorder, seq);
    if (algorithm != nullptr) record.algorithm(algorithm);
  }
  Collect sink;
  recorder.collect_metrics(sink, {});
  EXPECT_EQ(sink.calls.size(), 2u);
  EXPECT_EQ(sink.calls["allreduce/ring"], 3);
  EXPECT_EQ(sink.calls["allreduce/none"], 1);
}

TEST(FlightRecorder, OffRecordsNothing) {
  FlightRecorder recorder(0);
  EXPECT_FALSE(recorder.enabled());
  recorder.begin(1, "allreduce", 8, -1);
  { Recording record(&recorder, 1); }
  EXPECT_TRUE(recorder.to_json().empty());
}

// Through a communicator: collectives, a usage error and a pending receive show in its state.
TEST(FlightRecorder, CommunicatorStateShowsCallsErrorsAndPendingReceives) {
  anview::testing::run_ranks(2, [](Communicator& comm) {
    std::vector<float> data(1024, 1.0f);
    comm.allreduce(data.data(), data.size(), DataType::float32, ReduceOp::sum);
    comm.broadcast(data.data(), data.size(), DataType::float32, 1);
    const Error e = anview::testing::expect_error(
        [&] { comm.broadcast(data.data(), data.size(), DataType::float32, 7); });
    EXPECT_EQ(e.kind(), ErrorKind::usage);
    char byte = 0;
    Request pending = comm.irecv(&byte, 1, any_source, Tag{5});

    const auto state = nlohmann::json::parse(comm.dump_state());
    EXPECT_EQ(state["rank"], comm.rank());
    EXPECT_EQ(state["size"], 2);
    const auto& calls = state["collectives"];
    auto find = [&](const std::string& op, const std::string& status) {
      for (const auto& c : calls)
        if (c["op"] == op && c["state"] == status) return c;
      return nlohmann::json();
    };
    const auto allreduce = find("allreduce", "done");
    ASSERT_FALSE(allreduce.is_null()) << calls.dump();
    EXPECT_EQ(allreduce["bytes"], 4096);
    EXPECT_FALSE(allreduce["algorithm"].get<std::string>().empty());
    const auto broadcast = find("broadcast", "done");
    ASSERT_FALSE(broadcast.is_null()) << calls.dump();
    EXPECT_EQ(broadcast["root"], 1);
    const auto failed = find("broadcast", "failed");
    ASSERT_FALSE(failed.is_null()) << calls.dump();
    EXPECT_NE(failed["error"].get<std::string>().find("root 7"), std::string::npos);
    bool found = false;
    for (const auto& r : state["pending_p2p"])
      found = found || (r["kind"] == "recv" && r["peer"] == "any" && r["tag"] == 5);
    EXPECT_TRUE(found) << state["pending_p2p"].dump();
    ASSERT_EQ(state["peers"].size(), 2u);
    EXPECT_EQ(state["peers"][comm.rank()]["transport"], "self");

    comm.barrier();  // both have looked before either message goes
    comm.send(&byte, 1, 1 - comm.rank(), Tag{5});
    pending.wait();
  });
}

}  // namespace
}  // namespace anview::collectives
