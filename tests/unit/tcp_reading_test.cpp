// How a TCP stream reads frames (transport/tcp/connection.cpp, multipath.cpp), against a real
// TcpTransport on loopback and a raw rank 0 that writes the bytes by hand: when the receiver
// waits and for how many bytes, and what a multi-path link acknowledges.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "support/scoped_env.hpp"
#include "support/tcp_rank_one.hpp"
#include "transport/tcp/connection.hpp"
#include "transport/tcp/sequence.hpp"

namespace anview::transport::tcp {
namespace {

using anview::testing::ScopedEnv;
using anview::testing::TakingSink;
using anview::testing::TcpRankOne;
using namespace std::chrono_literals;

void send_bytes(int fd, const void* data, std::size_t bytes) {
  ASSERT_EQ(::send(fd, data, bytes, MSG_NOSIGNAL), static_cast<ssize_t>(bytes));
}

std::vector<char> frame_bytes(std::uint32_t payload_bytes, std::uint64_t tag,
                              std::uint64_t seq = 0) {
  WireHeader h;
  h.seq = seq;
  h.frame.type = 1;
  h.frame.payload_bytes = payload_bytes;
  h.frame.tag = tag;
  std::vector<char> bytes(sizeof h + payload_bytes, 'x');
  std::memcpy(bytes.data(), &h, sizeof h);
  return bytes;
}

// Rank 1 admits the raw rank 0's stream (path 0 of `path_count`) and answers its handshake.
base::Fd connected_rank_zero(TcpRankOne& rank1, std::uint8_t path_count) {
  base::Fd peer = rank1.connect();
  if (!peer.valid()) return peer;
  Handshake hello = rank1.hello();
  set_path_fields(hello, {.path = 0, .path_count = path_count, .generation = 1});
  send_bytes(peer.get(), &hello, sizeof hello);
  Handshake ack;
  if (!rank1.drive_until([&] { return rank1.transport().ready(); }, 2s) ||
      !TcpRankOne::read_exactly(peer.get(), &ack, sizeof ack))
    return base::Fd();
  return peer;
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
  const base::Fd peer = connected_rank_zero(rank1, 1);
  ASSERT_TRUE(peer.valid());

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

// On a link of several paths the receiver acknowledges the data chunks it has taken, and the
// sender completes each send on that acknowledgement. A chunk the sink refuses (a put into a
// region that is gone) has arrived all the same and must count: before, it did not, and the
// acknowledgement stayed below it for good, so every later send to that rank waited forever.
TEST(TcpReading, AChunkTheSinkRefusedIsAcknowledgedLikeAnyOther) {
  const ScopedEnv streams("ANVIEW_TCP_STREAMS", "1");
  const ScopedEnv ifaces("ANVIEW_IFACES", "lo");
  TakingSink sink;
  TcpRankOne rank1(sink, 12);
  const base::Fd peer = connected_rank_zero(rank1, 2);  // a multi-path link
  ASSERT_TRUE(peer.valid());
  sink.refuse = true;
  const auto refused = frame_bytes(100, 1, chunk_seq_bit | 1);
  send_bytes(peer.get(), refused.data(), refused.size());
  ASSERT_TRUE(rank1.drive_until([&] { return sink.refused == 1; }, 2s));
  sink.refuse = false;
  const auto taken = frame_bytes(100, 2, chunk_seq_bit | 2);
  send_bytes(peer.get(), taken.data(), taken.size());
  ASSERT_TRUE(rank1.drive_until([&] { return sink.done == 1; }, 2s));
  EXPECT_EQ(sink.started, 1);  // the refused chunk was not handed to the sink as done
  // Rank 1's acknowledgements: the last one must cover chunk 2.
  std::uint64_t chunks_acknowledged = 0;
  const auto end = std::chrono::steady_clock::now() + 2s;
  while (chunks_acknowledged < 2 && std::chrono::steady_clock::now() < end) {
    rank1.drive_until([] { return false; }, 10ms);
    WireHeader h;
    while (::recv(peer.get(), &h, sizeof h, MSG_DONTWAIT | MSG_PEEK) == sizeof h) {
      ASSERT_TRUE(TcpRankOne::read_exactly(peer.get(), &h, sizeof h));
      std::vector<char> payload(h.frame.payload_bytes);
      if (!payload.empty()) {
        ASSERT_TRUE(TcpRankOne::read_exactly(peer.get(), payload.data(), payload.size()));
      }
      if (h.frame.type == frame_ack) chunks_acknowledged = h.frame.id;
    }
  }
  EXPECT_EQ(chunks_acknowledged, 2u) << "the acknowledgement stopped below the refused chunk";
}

}  // namespace
}  // namespace anview::transport::tcp
