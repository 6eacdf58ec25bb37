// How a TCP stream reads frames (transport/tcp/connection.cpp, multipath.cpp), against a real
// TcpTransport on loopback and a raw rank 0 that writes the bytes by hand: when the receiver
// waits and for how many bytes, and what a multi-path link acknowledges.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
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

// One stream per path, every path over lo: the links these tests write to by hand.
struct OneStreamOverLo {
  ScopedEnv streams{"ANVIEW_TCP_STREAMS", "1"};
  ScopedEnv ifaces{"ANVIEW_IFACES", "lo"};
};

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
  const OneStreamOverLo settings;
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
  const OneStreamOverLo settings;
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

// Stream `stream` of `streams` of path `index` of `count` from the raw rank 0, past its
// handshake; invalid on failure.
base::Fd connect_stream(TcpRankOne& rank1, std::uint8_t index, std::uint8_t count,
                        std::uint8_t stream = 0, std::uint8_t streams = 1) {
  base::Fd peer = rank1.connect();
  if (!peer.valid()) return peer;
  Handshake hello = rank1.hello();
  hello.stream = stream;
  hello.stream_count = streams;
  set_path_fields(hello, {.path = index, .path_count = count, .generation = 1});
  send_bytes(peer.get(), &hello, sizeof hello);
  Handshake ack;
  if (!rank1.drive_until(
          [&] {
            return ::recv(peer.get(), &ack, sizeof ack, MSG_DONTWAIT | MSG_PEEK) == sizeof ack;
          },
          2s) ||
      !TcpRankOne::read_exactly(peer.get(), &ack, sizeof ack))
    return base::Fd();
  return peer;
}
base::Fd connect_path(TcpRankOne& rank1, std::uint8_t index, std::uint8_t count) {
  return connect_stream(rank1, index, count);
}

// What rank 1 says about its link to rank 0 (describe_peer): how many paths are up, and how
// many data chunks wait for a stream.
int paths_up(TcpTransport& tcp) {
  const std::string text = tcp.describe_peer(0);
  int up = 0;
  for (auto at = text.find(" up"); at != std::string::npos; at = text.find(" up", at + 1)) ++up;
  return up;
}
long chunks_waiting(TcpTransport& tcp) {
  const std::string text = tcp.describe_peer(0);
  const auto at = text.find(" waiting for a stream");
  if (at == std::string::npos) return -1;
  const auto open = text.rfind('(', at);
  return std::stol(text.substr(open + 1, at - open - 1));
}

// The raw rank 0's two paths to rank 1 (path 0 first), both up.
void open_two_paths(TcpRankOne& rank1, base::Fd (&paths)[2]) {
  paths[0] = connected_rank_zero(rank1, 2);
  paths[1] = connect_path(rank1, 1, 2);
  ASSERT_TRUE(paths[0].valid() && paths[1].valid());
  TcpTransport& tcp = rank1.transport();
  ASSERT_TRUE(rank1.drive_until([&] { return paths_up(tcp) == 2; }, 2s)) << tcp.describe_peer(0);
}

// Takes what the socket holds now, without waiting.
std::size_t take_available(int fd, std::vector<char>& into, std::size_t most) {
  const std::size_t had = into.size();
  into.resize(had + most);
  const ssize_t n = ::recv(fd, into.data() + had, most, MSG_DONTWAIT);
  into.resize(had + static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
  return into.size() - had;
}

// Which of the raw rank 0's two path sockets carries data chunk 1 (peeked at, not taken;
// rank 1's own frames may come before it); -1 if neither within 2 s.
int path_of_first_chunk(TcpRankOne& rank1, const base::Fd (&paths)[2]) {
  int first = -1;
  rank1.drive_until(
      [&] {
        for (int p = 0; p < 2 && first < 0; ++p) {
          std::vector<char> peek(1 << 16);
          const ssize_t n =
              ::recv(paths[p].get(), peek.data(), peek.size(), MSG_DONTWAIT | MSG_PEEK);
          WireHeader h;
          for (std::size_t at = 0; n > 0 && at + sizeof h <= static_cast<std::size_t>(n);
               at += sizeof h + h.frame.payload_bytes) {
            std::memcpy(&h, peek.data() + at, sizeof h);
            if (h.seq == (chunk_seq_bit | 1)) first = p;
          }
        }
        return first >= 0;
      },
      2s);
  return first;
}

// A data chunk whose path failed after the peer had it whole is sent again on another path,
// and can still sit in that stream's queue when the acknowledgement of its first copy
// completes the send: the caller may then free or reuse its buffer. Before, the copy was
// written from that buffer all the same (memory the caller freed: here, bytes it wrote after
// the send completed went out); now the acknowledgement takes the copy out of the queue.
TEST(TcpReading, AnAcknowledgedChunkSentAgainIsNotWrittenFromTheCallersBuffer) {
  const OneStreamOverLo settings;
  // Small socket buffers: what a stream queued stays in its queue while the peer reads little.
  const ScopedEnv buffers("ANVIEW_TCP_SOCKBUF", "65536");
  TakingSink sink;
  TcpRankOne rank1(sink, 13);
  base::Fd paths[2];
  ASSERT_NO_FATAL_FAILURE(open_two_paths(rank1, paths));
  for (const auto& fd : paths) base::set_buffer_sizes(fd.get(), 65536);
  TcpTransport& tcp = rank1.transport();

  // The chunk, first: it goes out at once on one path (the "first").
  std::vector<char> chunk(4096, 'c');
  bool chunk_done = false;
  FrameHeader header;
  header.type = 1;
  header.payload_bytes = static_cast<std::uint32_t>(chunk.size());
  tcp.post_send(0, header, chunk.data(), Ordering::any_stream, [&](const Error* error) {
    ASSERT_EQ(error, nullptr);
    chunk_done = true;
    std::memset(chunk.data(), 'X', chunk.size());  // the caller's buffer is its own again
  });
  const int first = path_of_first_chunk(rank1, paths);
  ASSERT_GE(first, 0) << tcp.describe_peer(0);
  const int second = 1 - first;
  // 40 MiB behind it, which neither path's sockets can hold: both streams' queues fill.
  const std::vector<char> filler(256 * 1024, 'f');
  header.payload_bytes = static_cast<std::uint32_t>(filler.size());
  for (int i = 0; i < 160; ++i)
    tcp.post_send(0, header, filler.data(), Ordering::any_stream, [](const Error*) {});
  rank1.drive_until([] { return false; }, 300ms);
  // The peer takes the chunk whole on the first path, which then fails.
  WireHeader h;
  std::vector<char> got;
  do {  // (rank 1's own frames may come first)
    ASSERT_TRUE(TcpRankOne::read_exactly(paths[first].get(), &h, sizeof h));
    got.resize(h.frame.payload_bytes);
    if (!got.empty()) {
      ASSERT_TRUE(TcpRankOne::read_exactly(paths[first].get(), got.data(), got.size()));
    }
  } while (h.seq != (chunk_seq_bit | 1));
  ASSERT_EQ(got, std::vector<char>(4096, 'c'));
  paths[first].reset();
  ASSERT_TRUE(rank1.drive_until([&] { return paths_up(tcp) == 1; }, 2s)) << tcp.describe_peer(0);
  // The second path's stream drains a little, until the chunk, first in line to go again,
  // joins its queue (behind most of a megabyte).
  const long waiting = chunks_waiting(tcp);
  ASSERT_GT(waiting, 0) << tcp.describe_peer(0);
  std::vector<char> stream;
  ASSERT_TRUE(rank1.drive_until(
      [&] {
        if (chunks_waiting(tcp) < waiting) return true;
        take_available(paths[second].get(), stream, 16 * 1024);
        return false;
      },
      5s))
      << tcp.describe_peer(0);
  // Its first copy is acknowledged, and the send completes.
  WireHeader ack;
  ack.frame.type = frame_ack;
  ack.frame.id = 1;
  send_bytes(paths[second].get(), &ack, sizeof ack);
  ASSERT_TRUE(rank1.drive_until([&] { return chunk_done; }, 2s)) << tcp.describe_peer(0);
  // Everything the second path carries from now on: no copy of the chunk from its buffer.
  auto last_data = std::chrono::steady_clock::now();
  rank1.drive_until(
      [&] {
        if (take_available(paths[second].get(), stream, 1 << 20) > 0)
          last_data = std::chrono::steady_clock::now();
        return std::chrono::steady_clock::now() - last_data > 300ms;
      },
      20s);
  std::size_t at = 0, fillers = 0;
  while (stream.size() - at >= sizeof h) {
    std::memcpy(&h, stream.data() + at, sizeof h);
    if (stream.size() - at - sizeof h < h.frame.payload_bytes) break;
    const char* payload = stream.data() + at + sizeof h;
    if (h.seq == (chunk_seq_bit | 1)) {
      EXPECT_EQ(std::string(payload, h.frame.payload_bytes), std::string(4096, 'c'))
          << "the chunk went out again from the buffer its send had given back";
    }
    if (h.frame.payload_bytes == filler.size()) ++fillers;
    at += sizeof h + h.frame.payload_bytes;
  }
  EXPECT_GE(fillers, 160u);  // every other chunk arrived, some twice
}

// With three paths, a chunk whose path failed is sent again on a path that comes up later. The
// peer must learn of the failure on that path before the copy: the news went out only on the
// paths up when it failed, and the peer, still reading the original on the failed path (it
// does not know it failed), took the copy read first on the new path for a duplicate and
// dropped it, then lost the original with the path: the message never completed. Now a path
// that comes up carries the news of every failed path first.
TEST(TcpReading, APathThatComesUpTellsOfTheFailedPathsBeforeAnyCopy) {
  const OneStreamOverLo settings;
  const ScopedEnv buffers("ANVIEW_TCP_SOCKBUF", "65536");
  TakingSink sink;
  TcpRankOne rank1(sink, 14);
  base::Fd paths[2] = {connected_rank_zero(rank1, 3), connect_path(rank1, 1, 3)};
  ASSERT_TRUE(paths[0].valid() && paths[1].valid());
  for (const auto& fd : paths) base::set_buffer_sizes(fd.get(), 65536);
  TcpTransport& tcp = rank1.transport();
  ASSERT_TRUE(rank1.drive_until([&] { return paths_up(tcp) == 2; }, 2s)) << tcp.describe_peer(0);

  // The chunk goes out on one of the two paths up; megabytes fill both streams' queues behind.
  std::vector<char> chunk(4096, 'c');
  FrameHeader header;
  header.type = 1;
  header.payload_bytes = static_cast<std::uint32_t>(chunk.size());
  tcp.post_send(0, header, chunk.data(), Ordering::any_stream, [](const Error*) {});
  const int first = path_of_first_chunk(rank1, paths);
  ASSERT_GE(first, 0) << tcp.describe_peer(0);
  const std::vector<char> filler(256 * 1024, 'f');
  header.payload_bytes = static_cast<std::uint32_t>(filler.size());
  for (int i = 0; i < 160; ++i)
    tcp.post_send(0, header, filler.data(), Ordering::any_stream, [](const Error*) {});
  rank1.drive_until([] { return false; }, 300ms);
  // The chunk's path fails; the other one's queue is full, so the chunk waits to go again.
  paths[first].reset();
  ASSERT_TRUE(rank1.drive_until([&] { return paths_up(tcp) == 1; }, 2s)) << tcp.describe_peer(0);
  ASSERT_GT(chunks_waiting(tcp), 0) << tcp.describe_peer(0);
  // Path 2 comes up, and the chunk goes again on it.
  const base::Fd third = connect_path(rank1, 2, 3);
  ASSERT_TRUE(third.valid());
  std::vector<char> stream;
  bool told = false, copy = false;
  ASSERT_TRUE(rank1.drive_until(
      [&] {
        take_available(third.get(), stream, 1 << 20);
        std::size_t at = 0;
        WireHeader h;
        while (!copy && stream.size() - at >= sizeof h) {
          std::memcpy(&h, stream.data() + at, sizeof h);
          if (h.frame.type == frame_path_down && h.frame.arg == static_cast<std::uint64_t>(first))
            told = true;
          if (h.seq == (chunk_seq_bit | 1)) copy = true;
          if (stream.size() - at - sizeof h < h.frame.payload_bytes) break;
          at += sizeof h + h.frame.payload_bytes;
        }
        return copy;
      },
      5s))
      << tcp.describe_peer(0);
  EXPECT_TRUE(told) << "the copy of the chunk came on path 2 before the news that path " << first
                    << " failed";
}

// A frame cut off when its path failed is finished by its copy on another path, which lands
// where the original began: the copy must be that frame. One announcing another size (a buggy
// or hostile peer) wrote its whole payload into the original's landing, past its end; it is a
// protocol error now.
TEST(TcpReading, ACopyOfACutOffFrameThatAnnouncesAnotherSizeIsAProtocolError) {
  const OneStreamOverLo settings;
  TakingSink sink;
  TcpRankOne rank1(sink, 17);
  base::Fd paths[2];
  ASSERT_NO_FATAL_FAILURE(open_two_paths(rank1, paths));
  TcpTransport& tcp = rank1.transport();
  // Ordered frame 1 of 100 bytes, cut off after 50 on path 0, which then fails.
  const std::vector<char> original = frame_bytes(100, 5, 1);
  send_bytes(paths[0].get(), original.data(), sizeof(WireHeader) + 50);
  ASSERT_TRUE(rank1.drive_until([&] { return sink.started == 1; }, 2s));
  ASSERT_EQ(sink.landing.size(), 100u);
  paths[0].reset();
  ASSERT_TRUE(rank1.drive_until([&] { return paths_up(tcp) == 1; }, 2s)) << tcp.describe_peer(0);
  // Its "copy" on path 1 announces 100000 bytes.
  const std::vector<char> copy = frame_bytes(100000, 5, 1);
  send_bytes(paths[1].get(), copy.data(), copy.size());
  ASSERT_TRUE(rank1.drive_until([&] { return sink.peer_failures > 0; }, 2s))
      << tcp.describe_peer(0);
  EXPECT_EQ(sink.peer_failures, 1);
  EXPECT_EQ(sink.done, 0);
}

// The grants of the frames in `stream` (whole frames only) for data streams of path `path`.
std::vector<std::uint64_t> grants_for_path(const std::vector<char>& stream, std::uint64_t path) {
  std::vector<std::uint64_t> grants;
  WireHeader h;
  for (std::size_t at = 0; stream.size() - at >= sizeof h; at += sizeof h + h.frame.payload_bytes) {
    std::memcpy(&h, stream.data() + at, sizeof h);
    if (stream.size() - at - sizeof h < h.frame.payload_bytes) break;
    if (h.frame.type == frame_credit && h.frame.tag == path) grants.push_back(h.frame.arg);
  }
  return grants;
}

// Every grant travels on the control path. One lost with it (the path failed before the peer
// read it) left the peer's data streams on the other paths without credit once they had used
// theirs, while this side, having read everything, waited for their data: bulk transfers
// froze on the paths left until the operation's timeout. The grants go again on the paths left.
TEST(TcpReading, GrantsLostWithTheControlPathGoAgainOnThePathsLeft) {
  const ScopedEnv streams("ANVIEW_TCP_STREAMS", "2");
  const ScopedEnv ifaces("ANVIEW_IFACES", "lo");
  // A window of the minimum (64 KiB) whatever the paths up: no grant is due again once a
  // path failed, unless the transport sends the lost ones again.
  const ScopedEnv credit("ANVIEW_TCP_CREDIT", "65536");
  TakingSink sink;
  TcpRankOne rank1(sink, 19, "other-host");  // another host: rank 1 grants rank 0 credit
  base::Fd fds[2][2];
  for (std::uint8_t p = 0; p < 2; ++p)
    for (std::uint8_t s = 0; s < 2; ++s) {
      fds[p][s] = connect_stream(rank1, p, 2, s, 2);
      ASSERT_TRUE(fds[p][s].valid()) << "path " << int{p} << " stream " << int{s};
    }
  TcpTransport& tcp = rank1.transport();
  ASSERT_TRUE(rank1.drive_until([&] { return paths_up(tcp) == 2; }, 2s)) << tcp.describe_peer(0);
  // 300 KiB on path 1's data stream (past the first 256 KiB of credit: rank 0 is raw and
  // takes no notice): rank 1 grants more as it reads, on path 0 (the control path).
  const std::vector<char> chunk = frame_bytes(300 << 10, 3, chunk_seq_bit | 1);
  send_bytes(fds[1][1].get(), chunk.data(), chunk.size());
  std::vector<char> on_path0;
  ASSERT_TRUE(rank1.drive_until(
      [&] {
        take_available(fds[0][1].get(), on_path0, 1 << 16);
        return !grants_for_path(on_path0, 1).empty();
      },
      2s))
      << tcp.describe_peer(0);
  const std::uint64_t granted = grants_for_path(on_path0, 1).back();
  // Path 0 fails before rank 0 read the grant (as far as rank 1 knows).
  for (auto& fd : fds[0]) fd.reset();
  ASSERT_TRUE(rank1.drive_until([&] { return paths_up(tcp) == 1; }, 2s)) << tcp.describe_peer(0);
  std::vector<char> on_path1;
  EXPECT_TRUE(rank1.drive_until(
      [&] {
        take_available(fds[1][1].get(), on_path1, 1 << 16);
        const auto grants = grants_for_path(on_path1, 1);
        return !grants.empty() && grants.back() >= granted;
      },
      2s))
      << "no grant for path 1 came on path 1 after path 0 failed; " << tcp.describe_peer(0);
}

// A peer that does not read (a busy application; its unexpected-message budget full) closes
// its receive window, and our kernel probes the window at growing gaps, each probe answered.
// That is not a dead path: it was taken for one (the probes' backoff counted as unacknowledged
// data, for as long as since the last answer), the paths failed over one after the other, and
// after the link timeout the link failed.
TEST(TcpReading, APeerThatDoesNotReadIsNoDeadPath) {
  const OneStreamOverLo settings;
  const ScopedEnv buffers("ANVIEW_TCP_SOCKBUF", "65536");
  const ScopedEnv link_timeout("ANVIEW_TCP_LINK_TIMEOUT", "2s");
  TakingSink sink;
  TcpRankOne rank1(sink, 23);
  base::Fd paths[2];
  ASSERT_NO_FATAL_FAILURE(open_two_paths(rank1, paths));
  TcpTransport& tcp = rank1.transport();
  const std::vector<char> payload(64 << 10, 'p');
  FrameHeader header;
  header.type = 1;
  header.payload_bytes = static_cast<std::uint32_t>(payload.size());
  for (int i = 0; i < 200; ++i)
    tcp.post_send(0, header, payload.data(), Ordering::ordered, [](const Error*) {});
  rank1.drive_until([] { return false; }, 3s);  // rank 0 reads nothing meanwhile
  EXPECT_EQ(paths_up(tcp), 2) << tcp.describe_peer(0);
  EXPECT_EQ(sink.peer_failures, 0) << tcp.describe_peer(0);
}

}  // namespace
}  // namespace anview::transport::tcp
