// Who gets in on a TCP data port (transport/tcp/admission.cpp), against a real TcpTransport on
// loopback and raw sockets.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <thread>
#include <vector>

#include "support/scoped_env.hpp"
#include "support/tcp_rank_one.hpp"

namespace anview::transport::tcp {
namespace {

using anview::testing::ScopedEnv;
using anview::testing::TakingSink;
using anview::testing::TcpRankOne;
using namespace std::chrono_literals;

// A peer's hello that arrived just before a flood of idle connections, all accepted in one
// round: the oldest pending connection gives way only after one read, so the peer is admitted
// and an idler is dropped (before, the peer was dropped unread and never got in).
TEST(TcpAdmission, AHelloThatArrivedBeforeAFloodIsServedFirst) {
  const ScopedEnv streams("ANVIEW_TCP_STREAMS", "1");
  const ScopedEnv ifaces("ANVIEW_IFACES", "lo");
  const ScopedEnv pending("ANVIEW_MAX_PENDING_CONNECTIONS", "1");
  TakingSink sink;
  TcpRankOne rank1(sink, 7);
  const base::Fd peer = rank1.connect();
  ASSERT_TRUE(peer.valid());
  const Handshake hello = rank1.hello();
  ASSERT_EQ(::send(peer.get(), &hello, sizeof hello, MSG_NOSIGNAL), ssize_t{sizeof hello});
  std::vector<base::Fd> idlers;
  for (int i = 0; i < 3; ++i) idlers.push_back(rank1.connect());
  std::this_thread::sleep_for(20ms);  // everything is in the backlog, the hello in its socket
  EXPECT_TRUE(rank1.drive_until([&] { return rank1.transport().ready(); }, 2s))
      << "the peer's connection was dropped before its hello was read";
  Handshake ack;
  EXPECT_EQ(::recv(peer.get(), &ack, sizeof ack, MSG_WAITALL), ssize_t{sizeof ack});
  EXPECT_EQ(ack.kind, HandshakeKind::ack);
}

// A hello for a path that failed, with the generation it failed in, is a stale stream of the
// old path (its sibling's failure came first): it is refused, and only a newer generation
// brings the path back. Before, it was admitted into the failed path, where an error on it
// failed the whole link although another path was up.
TEST(TcpAdmission, AStreamOfAFailedPathIsRefusedUnlessItIsNewer) {
  const ScopedEnv streams("ANVIEW_TCP_STREAMS", "1");
  const ScopedEnv ifaces("ANVIEW_IFACES", "lo");
  TakingSink sink;
  TcpRankOne rank1(sink, 13);
  auto open_path = [&](std::uint8_t path, std::uint16_t generation, HandshakeKind expect) {
    base::Fd fd = rank1.connect();
    Handshake hello = rank1.hello();
    set_path_fields(hello, {.path = path, .path_count = 2, .generation = generation});
    EXPECT_EQ(::send(fd.get(), &hello, sizeof hello, MSG_NOSIGNAL), ssize_t{sizeof hello});
    Handshake reply;
    std::jthread reader(
        [&] { EXPECT_TRUE(TcpRankOne::read_exactly(fd.get(), &reply, sizeof reply)); });
    rank1.drive_until([&] { return false; }, 100ms);
    reader.join();
    EXPECT_EQ(reply.kind, expect) << "path " << int{path} << " generation " << generation;
    return fd;
  };
  base::Fd path0 = open_path(0, 1, HandshakeKind::ack);
  const base::Fd path1 = open_path(1, 1, HandshakeKind::ack);
  ASSERT_TRUE(rank1.drive_until([&] { return rank1.transport().ready(); }, 2s));
  path0.reset();  // path 0 ends; path 1 carries on
  rank1.drive_until([] { return false; }, 100ms);
  ASSERT_EQ(sink.peer_failures, 0);
  base::Fd stale = open_path(0, 1, HandshakeKind::reject);
  const char garbage[64] = {1, 2, 3};
  ::send(stale.get(), garbage, sizeof garbage, MSG_NOSIGNAL);  // fails that stream, if anything
  rank1.drive_until([] { return false; }, 100ms);
  EXPECT_EQ(sink.peer_failures, 0) << "the link failed although path 1 is up";
  const base::Fd again = open_path(0, 2, HandshakeKind::ack);  // a newer generation: admitted
  rank1.drive_until([] { return false; }, 100ms);
  EXPECT_EQ(sink.peer_failures, 0);
}

}  // namespace
}  // namespace anview::transport::tcp
