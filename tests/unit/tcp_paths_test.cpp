// Path planning (which interface pairs connect two hosts) and the receiver's record of the
// sequence numbers it has taken (duplicates after a failover are recognised).
#include <gtest/gtest.h>

#include "transport/tcp/paths.hpp"
#include "transport/tcp/sequence.hpp"

namespace anview::transport::tcp {
namespace {

const std::vector<LocalAddress> two_nics = {{"10.0.1.1", 24}, {"10.0.2.1", 24}};

TEST(TcpPaths, SubnetsAreComparedUnderThePrefix) {
  EXPECT_TRUE(same_subnet("10.0.1.7", "10.0.1.1", 24));
  EXPECT_FALSE(same_subnet("10.0.2.7", "10.0.1.1", 24));
  EXPECT_TRUE(same_subnet("10.0.2.7", "10.0.1.1", 16));
  EXPECT_TRUE(same_subnet("10.0.1.1", "10.0.1.1", 32));
  EXPECT_FALSE(same_subnet("10.0.1.2", "10.0.1.1", 32));
  EXPECT_FALSE(same_subnet("not an ip", "10.0.1.1", 24));
  EXPECT_FALSE(same_subnet("10.0.1.2", "10.0.1.1", 0));  // no prefix known: no claim
}

TEST(TcpPaths, EachInterfacePairsWithThePeerAddressOnItsSubnet) {
  // The peer lists its addresses in another order: pairing goes by subnet, not position.
  const auto plan =
      plan_paths(two_nics, {"10.0.2.2:4000", "10.0.1.2:4000", "127.0.0.1:4000"}, false, 8);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].local_ip, "10.0.1.1");
  EXPECT_EQ(plan[0].remote, "10.0.1.2:4000");
  EXPECT_EQ(plan[1].local_ip, "10.0.2.1");
  EXPECT_EQ(plan[1].remote, "10.0.2.2:4000");
  EXPECT_EQ(plan[0].describe(), "10.0.1.1 -> 10.0.1.2:4000");
}

TEST(TcpPaths, EveryAddressIsUsedOnceOnEachSide) {
  // Two local NICs on one subnet, the peer with three there: two paths, distinct ends.
  const auto plan = plan_paths({{"10.0.1.1", 24}, {"10.0.1.5", 24}},
                               {"10.0.1.2:1", "10.0.1.3:1", "10.0.1.4:1"}, false, 8);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].remote, "10.0.1.2:1");
  EXPECT_EQ(plan[1].remote, "10.0.1.3:1");
  EXPECT_EQ(plan_paths({{"10.0.1.1", 24}, {"10.0.1.5", 24}}, {"10.0.1.2:1", "10.0.1.3:1"}, false, 1)
                .size(),
            1u);  // ANVIEW_TCP_PATHS=1
}

TEST(TcpPaths, NoSharedSubnetFallsBackToOneRoutedPath) {
  const auto plan = plan_paths(two_nics, {"127.0.0.1:9", "192.168.5.5:9"}, false, 8);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].local_ip, "");  // the kernel's routes choose the interface
  EXPECT_EQ(plan[0].remote, "192.168.5.5:9");
}

TEST(TcpPaths, SameHostUsesLoopbackAndOtherHostsNever) {
  const std::vector<std::string> remote = {"10.0.1.2:5", "127.0.0.1:5"};
  const auto local = plan_paths(two_nics, remote, true, 8);
  ASSERT_EQ(local.size(), 1u);
  EXPECT_EQ(local[0].remote, "127.0.0.1:5");
  EXPECT_TRUE(plan_paths(two_nics, {"127.0.0.1:5"}, false, 8).empty());
  EXPECT_TRUE(plan_paths(two_nics, {}, false, 8).empty());
}

TEST(TcpSequence, InOrderNumbersKeepTheSetAFloor) {
  SeqSet s;
  for (std::uint64_t n = 1; n <= 1000; ++n) s.insert(n);
  EXPECT_EQ(s.floor(), 1000u);
  EXPECT_EQ(s.above_floor(), 0u);
  EXPECT_TRUE(s.contains(1));
  EXPECT_TRUE(s.contains(1000));
  EXPECT_FALSE(s.contains(1001));
}

TEST(TcpSequence, OutOfOrderNumbersFillTheGapThenCollapse) {
  SeqSet s;
  s.insert(1);
  s.insert(3);
  s.insert(5);
  EXPECT_EQ(s.floor(), 1u);  // 2 is missing: acknowledgements stop at 1
  EXPECT_TRUE(s.contains(3));
  EXPECT_FALSE(s.contains(2));
  EXPECT_FALSE(s.contains(4));
  s.insert(3);  // a copy changes nothing
  EXPECT_EQ(s.above_floor(), 2u);
  s.insert(2);
  EXPECT_EQ(s.floor(), 3u);
  s.insert(4);
  EXPECT_EQ(s.floor(), 5u);
  EXPECT_EQ(s.above_floor(), 0u);
  s.insert(2);  // below the floor: already in
  EXPECT_EQ(s.floor(), 5u);
}

TEST(TcpSequence, ChunkNumbersAreMarkedByTheTopBit) {
  EXPECT_TRUE(is_chunk_seq(chunk_seq_bit | 7));
  EXPECT_FALSE(is_chunk_seq(7));
  EXPECT_FALSE(is_chunk_seq(0));
}

}  // namespace
}  // namespace anview::transport::tcp
