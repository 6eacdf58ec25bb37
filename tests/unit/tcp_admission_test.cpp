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

}  // namespace
}  // namespace anview::transport::tcp
