// How a TCP stream reads frames (transport/tcp/connection.cpp), against a real TcpTransport on
// loopback and a raw rank 0 that writes the bytes by hand: when the receiver waits and for how
// many bytes.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "support/scoped_env.hpp"
#include "support/tcp_rank_one.hpp"
#include "transport/tcp/connection.hpp"

namespace anview::transport::tcp {
namespace {

using anview::testing::ScopedEnv;
using anview::testing::TakingSink;
using anview::testing::TcpRankOne;
using namespace std::chrono_literals;

void send_bytes(int fd, const void* data, std::size_t bytes) {
  ASSERT_EQ(::send(fd, data, bytes, MSG_NOSIGNAL), static_cast<ssize_t>(bytes));
}

std::vector<char> frame_bytes(std::uint32_t payload_bytes, std::uint64_t tag) {
  WireHeader h;
  h.frame.type = 1;
  h.frame.payload_bytes = payload_bytes;
  h.frame.tag = tag;
  std::vector<char> bytes(sizeof h + payload_bytes, 'x');
  std::memcpy(bytes.data(), &h, sizeof h);
  return bytes;
}

// A payload that arrives in parts makes the stream ask the kernel to wake it only once most of
// the rest is there (SO_RCVLOWAT). That threshold must not outlive the payload: here the frame
// after it is held back (reading pauses), then taken on resume, and the stream goes back to
// waiting with the socket empty. Before, it kept the 90 KB threshold, so a small frame that
// came next never woke it: the link hung until the timeout.
TEST(TcpReading, AFrameAfterAHeldBackOneWakesTheStreamWhateverItsSize) {
  const ScopedEnv streams("ANVIEW_TCP_STREAMS", "1");
  const ScopedEnv ifaces("ANVIEW_IFACES", "lo");
  TakingSink sink;
  TcpRankOne rank1(sink, 11);
  const base::Fd peer = rank1.connect();
  ASSERT_TRUE(peer.valid());
  const Handshake hello = rank1.hello();
  send_bytes(peer.get(), &hello, sizeof hello);
  ASSERT_TRUE(rank1.drive_until([&] { return rank1.transport().ready(); }, 2s));
  Handshake ack;
  ASSERT_TRUE(TcpRankOne::read_exactly(peer.get(), &ack, sizeof ack));

  // A 100 KB frame: its header and a first part, and the stream waits for the rest.
  const std::vector<char> big = frame_bytes(100000, 1);
  const std::size_t first = sizeof(WireHeader) + 10000;
  send_bytes(peer.get(), big.data(), first);
  ASSERT_TRUE(rank1.drive_until([&] { return sink.started == 1; }, 2s));
  rank1.drive_until([] { return false; }, 50ms);
  // The rest, with a frame the sink holds back right behind it.
  sink.hold = true;
  std::vector<char> rest(big.begin() + static_cast<std::ptrdiff_t>(first), big.end());
  const std::vector<char> held = frame_bytes(0, 2);
  rest.insert(rest.end(), held.begin(), held.end());
  send_bytes(peer.get(), rest.data(), rest.size());
  ASSERT_TRUE(rank1.drive_until([&] { return sink.done == 1; }, 2s));
  rank1.drive_until([] { return false; }, 50ms);
  ASSERT_EQ(sink.started, 1);  // the second frame is held back
  sink.hold = false;
  rank1.transport().resume(0);
  ASSERT_TRUE(rank1.drive_until([&] { return sink.done == 2; }, 2s));
  // A small frame now must be read.
  const std::vector<char> small = frame_bytes(100, 3);
  send_bytes(peer.get(), small.data(), small.size());
  EXPECT_TRUE(rank1.drive_until([&] { return sink.done == 3; }, 1s))
      << "a 140-byte frame did not wake the stream";
}

}  // namespace
}  // namespace anview::transport::tcp
