// The in-process transport between thread ranks: eager and rendezvous messages in order per
// pair and tag, any-source receives, the per-peer plan naming it, and a rank that closes its
// communicator early: its peers get peer_lost naming it, not a hang.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "support/scoped_env.hpp"
#include "support/thread_ranks.hpp"

namespace anview {
namespace {

using testing::make_payload;
using testing::payload_ok;
using testing::run_ranks;
using testing::ScopedEnv;

TEST(InprocTransport, RingOfEagerAndRendezvousMessagesInOrder) {
  ScopedEnv transports("ANVIEW_TRANSPORTS", "inproc");
  const int n = 8;
  run_ranks(n, [&](Communicator& comm) {
    const int right = (comm.rank() + 1) % n, left = (comm.rank() + n - 1) % n;
    EXPECT_EQ(comm.transport_name(right), "inproc");
    EXPECT_NE(comm.describe_peer(right).find("a thread of this process"), std::string::npos);
    const std::size_t sizes[] = {0, 1, 1000, 70000, 3 << 20};  // eager and rendezvous
    std::vector<std::vector<unsigned char>> in(std::size(sizes));
    std::vector<Request> recvs;
    for (std::size_t k = 0; k < std::size(sizes); ++k) {
      in[k].resize(sizes[k]);
      recvs.push_back(comm.irecv(in[k].data(), sizes[k], left, Tag{5}));
    }
    std::vector<std::vector<unsigned char>> out;
    for (std::size_t k = 0; k < std::size(sizes); ++k)
      out.push_back(make_payload(comm.rank(), k, sizes[k]));
    for (std::size_t k = 0; k < std::size(sizes); ++k)
      comm.send(out[k].data(), sizes[k], right, Tag{5});
    for (std::size_t k = 0; k < std::size(sizes); ++k) {
      const Status st = recvs[k].wait();
      EXPECT_EQ(st.bytes, sizes[k]);
      EXPECT_TRUE(payload_ok(in[k].data(), left, k, sizes[k])) << "message " << k;
    }
    // Any source: rank 0 hears from everyone.
    if (comm.rank() == 0) {
      for (int k = 1; k < n; ++k) {
        std::int32_t from = -1;
        const Status st = comm.recv(&from, sizeof from, any_source, Tag{6});
        EXPECT_EQ(from, st.source);
      }
    } else {
      const std::int32_t me = comm.rank();
      comm.send(&me, sizeof me, 0, Tag{6});
    }
  });
}

TEST(InprocTransport, APeerThatLeavesIsPeerLostNamingIt) {
  ScopedEnv transports("ANVIEW_TRANSPORTS", "inproc");
  run_ranks(2, [&](Communicator& comm) {
    if (comm.rank() == 1) return;  // closes its communicator at once
    std::int32_t x = 0;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      comm.recv(&x, sizeof x, 1, Tag{1}, std::chrono::seconds(10));
      ADD_FAILURE() << "a receive from a rank that left succeeded";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::peer_lost) << e.what();
      EXPECT_EQ(e.context().peer, 1) << e.what();
      EXPECT_NE(std::string(e.what()).find("closed its communicator"), std::string::npos)
          << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  });
}

}  // namespace
}  // namespace anview
