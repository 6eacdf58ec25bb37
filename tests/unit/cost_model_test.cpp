// The tuner's cost model: which algorithm it predicts fastest for the shapes that matter, and
// why it refuses the ones that cannot run.
#include "collectives/cost_model.hpp"

#include <gtest/gtest.h>

#include <string>

namespace anview::collectives {
namespace {

// Roughly this machine's shared memory and loopback TCP (GB/s = 1000 bytes/us).
CostModel shm_model() {
  return {.alpha_us = 1.0,
          .link_bpus = 5000,
          .reduce_bpus = 10000,
          .copy_bpus = 10000,
          .flag_us = 0.3,
          .source = "test"};
}
CostModel tcp_model() {
  return {.alpha_us = 15.0,
          .link_bpus = 1500,
          .reduce_bpus = 10000,
          .copy_bpus = 10000,
          .flag_us = 0,
          .source = "test"};
}
Topology one_host(int ranks) {
  return {.ranks = ranks,
          .shares_memory = true,
          .reads_peers = true,
          .shared_limit = 262144,
          .shared_whole = 65536,
          .chunk_bytes = 262144,
          .element_bytes = 4};
}
Topology hosts(int ranks) {
  return {.ranks = ranks,
          .shares_memory = false,
          .reads_peers = false,
          .shared_limit = 65536,
          .chunk_bytes = 262144,
          .element_bytes = 4};
}

// 8 ranks on 2 hosts, fast links inside each, TCP between them.
Topology two_hosts_of_four() {
  Topology t = hosts(8);
  t.hosts = 2;
  t.largest_host = 4;
  return t;
}
CostModel network_with_fast_hosts() {
  CostModel m = tcp_model();
  m.local_alpha_us = 1;
  m.local_link_bpus = 5000;
  return m;
}

std::string pick(std::string_view collective, std::size_t bytes, const Topology& t,
                 const CostModel& m) {
  const auto list = candidates(collective, bytes, t, m);
  const int best = cheapest(list);
  return best < 0 ? std::string("none") : list[static_cast<std::size_t>(best)].algorithm;
}

const Candidate& find(const std::vector<Candidate>& list, const std::string& name) {
  for (const auto& c : list)
    if (c.algorithm == name) return c;
  throw std::runtime_error("no candidate " + name);
}

TEST(CostModel, UnknownCollectiveHasNoCandidates) {
  EXPECT_TRUE(candidates("allreduse", 8, one_host(2), shm_model()).empty());
  EXPECT_EQ(cheapest({}), -1);
}

TEST(CostModel, OneHostAllreduceGoesThroughTheSlotsUnlessReadingPeersIsMuchFaster) {
  EXPECT_EQ(pick("allreduce", 8, one_host(2), shm_model()), "shared");
  EXPECT_EQ(pick("allreduce", 4096, one_host(4), shm_model()), "shared");
  EXPECT_EQ(pick("allreduce", 64 << 20, one_host(2), shm_model()), "shared");
  EXPECT_EQ(pick("allreduce", 16 << 20, one_host(4), shm_model()), "shared");
  CostModel m = shm_model();
  m.read_bpus = 40000;  // cross-memory attach four times as fast as a copy
  m.read_us = 1;
  EXPECT_EQ(pick("allreduce", 64 << 20, one_host(2), m), "direct");
}

TEST(CostModel, StagedSharedAllreduceIsChargedItsCopiesAndAFlagRoundPerStage) {
  const CostModel m = shm_model();
  // Up to shared_whole: one flag round, a copy in, every rank reduces all contributions.
  const double small = 65536;
  EXPECT_NEAR(find(candidates("allreduce", 65536, one_host(4), m), "shared").predicted_us,
              m.flag_us + small / m.copy_bpus + 3 * small / m.reduce_bpus, 1e-6);
  // Larger, 2 ranks: stages of 128 KiB (half a 256 KiB slot) of each rank's 8 MiB half, 64 of
  // them and the round that hands the last over. Each rank copies the half the other reduces
  // in, its reduced half into its slot and the other's out (3n/2), and reduces its half.
  const double n = 16 << 20;
  const double stages = (n / 2) / (128 * 1024);
  EXPECT_NEAR(find(candidates("allreduce", 16 << 20, one_host(2), m), "shared").predicted_us,
              (stages + 1) * m.flag_us + 1.5 * n / m.copy_bpus + (n / 2) / m.reduce_bpus, 1e-6);
}

TEST(CostModel, RanksSharingCpusSlowTheirOwnWorkNotTheMeasuredFlagsAndMessages) {
  CostModel m = shm_model();
  m.read_bpus = 10000;
  m.read_us = 2;
  const double n = 16 << 20;
  const double stages = (n / 4) / (64 * 1024);  // 4 ranks: a quarter of a 256 KiB slot each
  const double flags = (stages + 1) * m.flag_us;
  const double messages = 3 * m.alpha_us;  // the direct algorithm's postings, words, done
  auto predicted = [&](const char* algo) {
    return find(candidates("allreduce", 16 << 20, one_host(4), m), algo).predicted_us;
  };
  const double shared = predicted("shared"), direct = predicted("direct");
  m.crowding = 2;  // 4 ranks on 2 CPUs
  EXPECT_NEAR(predicted("shared") - flags, 2 * (shared - flags), 1e-6);
  EXPECT_NEAR(predicted("direct") - messages, 2 * (direct - messages), 1e-6);
}

TEST(CostModel, DirectAlgorithmsAreChargedThePeerReadBandwidth) {
  CostModel m = shm_model();
  m.link_bpus = 1000;   // messages: slow
  m.read_bpus = 10000;  // cross-memory attach: what the direct algorithms do
  m.read_us = 2;        // a system call per peer and 256 KiB
  const double n = 16 << 20;
  const double calls = (n / 2) / (256 * 1024);  // 32
  // allreduce, 2 ranks: three rounds of small messages, read the peer's half and write the
  // reduced half back, reduce one half.
  EXPECT_NEAR(
      find(candidates("allreduce", 16 << 20, one_host(2), m), "direct").predicted_us,
      3 * m.alpha_us + 2 * (calls * m.read_us + (n / 2) / m.read_bpus) + (n / 2) / m.reduce_bpus,
      1e-6);
  EXPECT_NEAR(find(candidates("reduce_scatter", 16 << 20, one_host(2), m), "direct").predicted_us,
              3 * m.alpha_us + calls * m.read_us + (n / 2) / m.read_bpus + (n / 2) / m.reduce_bpus,
              1e-6);
  // Small: the calls' own cost, not the bytes, decides; against the ring's one message.
  EXPECT_NEAR(find(candidates("reduce_scatter", 8, one_host(2), m), "direct").predicted_us,
              3 * m.alpha_us + m.read_us + 4 / m.read_bpus + 4 / m.reduce_bpus, 1e-6);
  // Not measured (no cross-memory attach probe): a message's bandwidth stands in.
  m.read_bpus = 0;
  EXPECT_NEAR(find(candidates("reduce_scatter", 16 << 20, one_host(2), m), "direct").predicted_us,
              3 * m.alpha_us + (n / 2) / m.link_bpus + (n / 2) / m.reduce_bpus, 1e-6);
}

TEST(CostModel, ReduceScatterReadsPeersOnOneHostAndHalvesOrRingsAcrossHosts) {
  EXPECT_EQ(pick("reduce_scatter", 16 << 20, one_host(2), shm_model()), "direct");
  EXPECT_EQ(pick("reduce_scatter", 16 << 20, one_host(4), shm_model()), "direct");
  // Across hosts, a power of two: recursive halving moves what the ring moves in log2(p)
  // messages instead of p-1.
  EXPECT_EQ(pick("reduce_scatter", 256, hosts(8), tcp_model()), "recursive_halving");
  EXPECT_EQ(pick("reduce_scatter", 16 << 20, hosts(4), tcp_model()), "recursive_halving");
  // Not a power of two: the fold sends the whole buffer once more; only small ones gain.
  EXPECT_EQ(pick("reduce_scatter", 256, hosts(6), tcp_model()), "recursive_halving");
  EXPECT_EQ(pick("reduce_scatter", 16 << 20, hosts(6), tcp_model()), "ring");
  const auto list = candidates("reduce_scatter", 1 << 20, hosts(4), tcp_model());
  EXPECT_FALSE(find(list, "direct").usable);
  EXPECT_NE(find(list, "direct").why_not.find("cross-memory attach"), std::string::npos);
}

TEST(CostModel, SameHostAlgorithmsAreRefusedWithTheReasonAcrossHosts) {
  const auto list = candidates("allreduce", 8, hosts(4), tcp_model());
  EXPECT_FALSE(find(list, "shared").usable);
  EXPECT_NE(find(list, "shared").why_not.find("one host"), std::string::npos);
  EXPECT_FALSE(find(list, "direct").usable);
  EXPECT_NE(find(list, "direct").why_not.find("cross-memory attach"), std::string::npos);
  const auto big = candidates("broadcast", 1 << 20, one_host(2), shm_model());
  EXPECT_FALSE(find(big, "shared").usable);
  EXPECT_NE(find(big, "shared").why_not.find("262144"), std::string::npos);
  // An allreduce of any size goes in stages of a cache line per rank at least.
  EXPECT_TRUE(find(candidates("allreduce", 1 << 20, one_host(4096), shm_model()), "shared").usable);
  EXPECT_FALSE(
      find(candidates("allreduce", 1 << 20, one_host(4097), shm_model()), "shared").usable);
}

TEST(CostModel, AcrossHostsLatencyBoundIsRecursiveDoublingBandwidthBoundHalvesTheData) {
  EXPECT_EQ(pick("allreduce", 8, hosts(8), tcp_model()), "recursive_doubling");
  // Ring and Rabenseifner move the same bytes; Rabenseifner needs log2(p) rounds, not p-1.
  EXPECT_EQ(pick("allreduce", 64 << 20, hosts(8), tcp_model()), "rabenseifner");
  const auto list = candidates("allreduce", 64 << 20, hosts(8), tcp_model());
  EXPECT_LT(find(list, "ring").predicted_us, 0.6 * find(list, "recursive_doubling").predicted_us);
}

// A message above the eager size waits for a request-to-send and a clear-to-send: three
// latencies. Two ranks over TCP at 256 KiB: Rabenseifner's two half-size rendezvous steps
// cost more than recursive doubling's one full-size step and a copy (measured here: 167 vs
// 132 us); with every message eager (no handshake) the halving would look cheaper.
TEST(CostModel, RendezvousSizedMessagesPayTwoMoreLatencies) {
  Topology t = hosts(2);
  t.eager_bytes = 65536;
  EXPECT_EQ(pick("allreduce", 262144, t, tcp_model()), "recursive_doubling");
  const auto list = candidates("allreduce", 262144, t, tcp_model());
  Topology all_eager = hosts(2);
  const auto eager = candidates("allreduce", 262144, all_eager, tcp_model());
  EXPECT_NEAR(find(list, "rabenseifner").predicted_us - find(eager, "rabenseifner").predicted_us,
              2 * 2 * tcp_model().alpha_us, 1e-9);
  EXPECT_EQ(pick("allreduce", 262144, all_eager, tcp_model()), "rabenseifner");
  // Large buffers still halve the data.
  EXPECT_EQ(pick("allreduce", 16 << 20, t, tcp_model()), "rabenseifner");
}

TEST(CostModel, HierarchicalNeedsSeveralHostsAndWinsWhereLatencyCrossesThemOnce) {
  EXPECT_FALSE(find(candidates("allreduce", 8, one_host(4), shm_model()), "hierarchical").usable);
  Topology spread = hosts(4);
  spread.hosts = 4;  // one rank per host: nothing to gain
  const auto alone = candidates("allreduce", 8, spread, tcp_model());
  EXPECT_FALSE(find(alone, "hierarchical").usable);
  EXPECT_NE(find(alone, "hierarchical").why_not.find("one rank per host"), std::string::npos);
  // 8 ranks on 2 hosts, fast links inside each: a small allreduce crosses the network once
  // (between the two leaders) instead of log2(8) times.
  const Topology two = two_hosts_of_four();
  const CostModel m = network_with_fast_hosts();
  EXPECT_EQ(pick("allreduce", 8, two, m), "hierarchical");
  // Large: the binomial steps inside a host move the whole buffer log2(4) times each way;
  // Rabenseifner over all ranks moves less.
  EXPECT_EQ(pick("allreduce", 64 << 20, two, m), "rabenseifner");
}

TEST(CostModel, HierarchicalBroadcastReduceAllgatherCrossTheNetworkOncePerHost) {
  const Topology two = two_hosts_of_four();
  const CostModel m = network_with_fast_hosts();
  for (const char* collective : {"broadcast", "reduce", "allgather"}) {
    SCOPED_TRACE(collective);
    EXPECT_FALSE(find(candidates(collective, 8, one_host(4), shm_model()), "hierarchical").usable);
    Topology spread = hosts(4);
    spread.hosts = 4;
    EXPECT_FALSE(find(candidates(collective, 8, spread, tcp_model()), "hierarchical").usable);
    // Small: one network hop (two hosts) instead of log2(8) over the slowest link.
    EXPECT_EQ(pick(collective, 64, two, m), "hierarchical");
  }
  // A large reduce: the binomial tree over all ranks sends the buffer over the slowest link
  // log2(8) times in a row, the hierarchical one once. (A large broadcast stays with the flat
  // chain: pipelined, it carries the buffer over each link once and overlaps the two levels.)
  EXPECT_EQ(pick("reduce", 64 << 20, two, m), "hierarchical");
  EXPECT_EQ(pick("broadcast", 64 << 20, two, m), "chain");
  // A large allgather: the ring's p-1 network steps carry the same bytes as the leaders'
  // ring, which then still broadcasts inside each host: the flat ring stays ahead.
  EXPECT_TRUE(find(candidates("allgather", 64 << 20, two, m), "hierarchical").usable);
  EXPECT_EQ(pick("allgather", 64 << 20, two, m), "ring");
}

TEST(CostModel, FlatStepsOfHierarchicalOnesUseTheirOwnLinks) {
  const Topology two = two_hosts_of_four();
  const CostModel m = network_with_fast_hosts();
  // Inside a host a small broadcast costs its local alpha per binomial round.
  const Candidate inside = flat_step("broadcast", two, m, 8, 4, true);
  EXPECT_EQ(inside.algorithm, "binomial");
  EXPECT_NEAR(inside.predicted_us, 2 * (1 + 8.0 / 5000), 1e-9);
  // Among four hosts a large one is pipelined down the chain; messages only (never "shared").
  EXPECT_EQ(flat_step("broadcast", two, m, 64 << 20, 4, false).algorithm, "chain");
  EXPECT_EQ(flat_step("broadcast", two, m, 64 << 20, 2, false).algorithm, "binomial");
  EXPECT_EQ(flat_step("allreduce", two, m, 8, 2, false).algorithm, "recursive_doubling");
  EXPECT_EQ(flat_step("reduce", one_host(4), shm_model(), 8, 4, true).algorithm, "binomial");
}

TEST(CostModel, NonPowerOfTwoRanksPayForFolding) {
  const auto six = candidates("allreduce", 1 << 20, hosts(6), tcp_model());
  const auto four = candidates("allreduce", 1 << 20, hosts(4), tcp_model());
  EXPECT_GT(find(six, "recursive_doubling").predicted_us,
            find(four, "recursive_doubling").predicted_us);
  EXPECT_GT(find(six, "rabenseifner").predicted_us, find(four, "rabenseifner").predicted_us);
}

TEST(CostModel, RingNeedsAnElementPerRank) {
  const auto list = candidates("allreduce", 12, hosts(4), tcp_model());  // 3 floats
  EXPECT_FALSE(find(list, "ring").usable);
  EXPECT_TRUE(find(candidates("allreduce", 16, hosts(4), tcp_model()), "ring").usable);
}

TEST(CostModel, BroadcastSmallIsATreeLargeIsAPipelinedChain) {
  EXPECT_EQ(pick("broadcast", 8, hosts(8), tcp_model()), "binomial");
  EXPECT_EQ(pick("broadcast", 64 << 20, hosts(8), tcp_model()), "chain");
  EXPECT_EQ(pick("broadcast", 8, one_host(4), shm_model()), "shared");
}

TEST(CostModel, AllgatherSmallIsBruckLargeIsTheRing) {
  EXPECT_EQ(pick("allgather", 8 * 64, hosts(8), tcp_model()), "bruck");
  EXPECT_EQ(pick("allgather", 64 << 20, hosts(8), tcp_model()), "ring");
}

TEST(CostModel, AlltoallSmallBlocksAreBruckLargeArePairwise) {
  EXPECT_EQ(pick("alltoall", 64 * 8, hosts(64), tcp_model()), "bruck");
  EXPECT_EQ(pick("alltoall", 64 << 20, hosts(64), tcp_model()), "pairwise");
}

TEST(CostModel, EveryCollectiveHasAPrediction) {
  for (const char* c : {"allreduce", "broadcast", "reduce", "allgather", "reduce_scatter",
                        "alltoall", "gather", "scatter", "barrier"}) {
    SCOPED_TRACE(c);
    const auto list = candidates(c, 1 << 20, hosts(4), tcp_model());
    const int best = cheapest(list);
    ASSERT_GE(best, 0);
    EXPECT_GT(list[static_cast<std::size_t>(best)].predicted_us, 0);
  }
}

TEST(CostModel, TiesGoToTheFirstCandidate) {
  std::vector<Candidate> list{{"a", false, 0, "no"}, {"b", true, 5, {}}, {"c", true, 5, {}}};
  EXPECT_EQ(cheapest(list), 1);
}

TEST(CostModel, DescribeNamesEveryParameterAndTheSource) {
  const std::string text = describe(shm_model());
  EXPECT_NE(text.find("alpha 1.00 us"), std::string::npos) << text;
  EXPECT_NE(text.find("link 5.00 GB/s"), std::string::npos) << text;
  EXPECT_NE(text.find("(test)"), std::string::npos) << text;
}

}  // namespace
}  // namespace anview::collectives
