// The tuner on thread-per-rank communicators: every rank measures the same costs and picks the
// same algorithms, explain() shows every candidate and the pick, and the tuning file is
// written, reused for the same placement, and replaced when it does not fit.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/scoped_env.hpp"
#include "support/thread_ranks.hpp"

namespace anview {
namespace {

using testing::run_ranks;
using testing::ScopedEnv;

const std::size_t probe_sizes[] = {0, 8, 4096, 65536, 1 << 20, 16 << 20};
const char* const collectives[] = {"allreduce", "broadcast", "reduce", "allgather", "barrier"};

// Every rank's picks (and explanation of a 1 MiB allreduce) after one collective.
std::vector<std::vector<std::string>> picks_of_every_rank(int n) {
  std::vector<std::vector<std::string>> picks(static_cast<std::size_t>(n));
  run_ranks(n, [&](Communicator& comm) {
    float x = 1;
    comm.allreduce(&x, 1, DataType::float32, ReduceOp::sum);
    auto& mine = picks[static_cast<std::size_t>(comm.rank())];
    for (const char* c : collectives)
      for (std::size_t bytes : probe_sizes) mine.push_back(comm.collective_algorithm(c, bytes));
    mine.push_back(comm.explain_collective("allreduce", 1 << 20));
  });
  return picks;
}

TEST(Tuner, EveryRankPicksTheSameAlgorithms) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(n);
    const auto picks = picks_of_every_rank(n);
    for (int r = 1; r < n; ++r) EXPECT_EQ(picks[0], picks[static_cast<std::size_t>(r)]);
    for (const auto& p : picks[0]) EXPECT_FALSE(p.empty());
  }
}

TEST(Tuner, ExplainShowsEveryCandidateThePickAndTheMeasuredCosts) {
  run_ranks(2, [](Communicator& comm) {
    const std::string text = comm.explain_collective("broadcast", 1 << 20);
    EXPECT_NE(text.find("broadcast of 1048576 bytes (float32) on 2 ranks"), std::string::npos)
        << text;
    EXPECT_NE(text.find("(measured at the first collective)"), std::string::npos) << text;
    for (const char* algo : {"shared", "binomial", "chain"})
      EXPECT_NE(text.find(std::string("\n  ") + algo + " "), std::string::npos) << text;
    EXPECT_NE(text.find("<- pick"), std::string::npos) << text;
    // The pick explained by collective_algorithm() is the one marked.
    std::string why;
    const std::string algo = comm.collective_algorithm("broadcast", 1 << 20, &why);
    EXPECT_NE(text.find("  " + algo + " "), std::string::npos) << text;
    EXPECT_NE(why.find("predicted"), std::string::npos) << why;
    EXPECT_TRUE(comm.explain_collective("allreduse", 8).empty());
    // Still in step after an unknown name: the next collective works.
    std::int32_t x = comm.rank();
    comm.allreduce(&x, 1, DataType::int32, ReduceOp::sum);
    EXPECT_EQ(x, 1);
  });
}

TEST(Tuner, BeforeMeasuringReportsSayTheCostsAreAssumed) {
  run_ranks(2, [](Communicator& comm) {
    std::string why;
    EXPECT_FALSE(comm.collective_algorithm("allreduce", 1 << 20, &why).empty());
    EXPECT_NE(why.find("assumed"), std::string::npos) << why;
  });
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::string explain_with_file(int n) {
  std::string text;
  run_ranks(n, [&](Communicator& comm) {
    const std::string mine = comm.explain_collective("allreduce", 4096);
    if (comm.rank() == 0) text = mine;
  });
  return text;
}

TEST(Tuner, TuningFileIsWrittenReusedAndReplacedWhenItDoesNotFit) {
  const std::string path = "/tmp/anview-tuner-test-" + std::to_string(::getpid()) + ".json";
  std::remove(path.c_str());
  ScopedEnv file("ANVIEW_TUNING_FILE", path.c_str());

  EXPECT_NE(explain_with_file(2).find("measured at the first collective"), std::string::npos);
  const auto written = read_json(path);
  EXPECT_EQ(written.at("ranks"), 2);
  for (const char* key :
       {"alpha_us", "link_gbs", "read_gbs", "reduce_gbs", "copy_gbs", "flag_us", "crowding"})
    EXPECT_TRUE(written.contains(key)) << key << written;

  // The same job again: the file's costs, not a new measurement.
  EXPECT_NE(explain_with_file(2).find("tuning file " + path), std::string::npos);

  // Another rank count: measured again and rewritten.
  EXPECT_NE(explain_with_file(3).find("measured at the first collective"), std::string::npos);
  EXPECT_EQ(read_json(path).at("ranks"), 3);

  // Not a tuning file at all: measured again, never a crash.
  std::ofstream(path) << "garbage{";
  EXPECT_NE(explain_with_file(3).find("measured at the first collective"), std::string::npos);
  EXPECT_EQ(read_json(path).at("ranks"), 3);
  std::remove(path.c_str());
}

// Ranks of one host that outnumber the CPUs they may run on share them: the tuner measures how
// many share each (the copies and reductions it times run at full speed) and says so.
TEST(Tuner, RanksThatOutnumberTheirCpusAreChargedForSharingThem) {
  cpu_set_t set;
  ASSERT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
  const int cpus = CPU_COUNT(&set);
  const std::string path = "/tmp/anview-tuner-crowd-" + std::to_string(::getpid()) + ".json";
  std::remove(path.c_str());
  ScopedEnv file("ANVIEW_TUNING_FILE", path.c_str());
  const std::string text = explain_with_file(4);
  const double crowding = std::max(1.0, 4.0 / cpus);
  EXPECT_DOUBLE_EQ(read_json(path).at("crowding").get<double>(), crowding);
  char shown[64];
  std::snprintf(shown, sizeof shown, ", %.1f ranks per CPU", crowding);
  EXPECT_EQ(text.find(shown) != std::string::npos, crowding > 1) << text;
  std::remove(path.c_str());
}

// A rank may call allreduce in place while another does not (as NCCL allows): the pick must
// not depend on it. With copies made very slow, an out-of-place call's input copy made
// recursive doubling the dearest algorithm for it and the cheapest for the in-place rank: the
// two ran different algorithms against each other.
TEST(Tuner, RanksMixingInPlaceAndOutOfPlaceAllreducePickTheSameAlgorithm) {
  const std::string path = "/tmp/anview-tuner-inplace-" + std::to_string(::getpid()) + ".json";
  std::remove(path.c_str());
  ScopedEnv file("ANVIEW_TUNING_FILE", path.c_str());
  ScopedEnv tcp("ANVIEW_TRANSPORTS", "tcp");  // no same-host algorithm among the candidates
  explain_with_file(2);
  nlohmann::json costs = read_json(path);
  costs["alpha_us"] = 1.0;
  costs["link_gbs"] = 10.0;
  costs["reduce_gbs"] = 10.0;
  costs["copy_gbs"] = 0.001;
  costs["crowding"] = 1.0;
  std::ofstream(path) << costs.dump();
  constexpr std::size_t count = 1024;
  run_ranks(
      2,
      [&](Communicator& comm) {
        for (int round = 0; round < 3; ++round) {
          std::vector<float> in(count), out(count, -1);
          for (std::size_t i = 0; i < count; ++i) in[i] = float(comm.rank() + 1) * float(i % 7);
          if (comm.rank() == 0) {
            comm.allreduce(in.data(), count, DataType::float32, ReduceOp::sum);
            out = in;
          } else {
            comm.allreduce(in.data(), out.data(), count, DataType::float32, ReduceOp::sum);
          }
          for (std::size_t i = 0; i < count; ++i)
            ASSERT_EQ(out[i], 3.0f * float(i % 7)) << "rank " << comm.rank() << " index " << i;
        }
      },
      std::chrono::seconds(10));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace anview
