// The TCP transport's stream after the handshake (transport/tcp): Connection's frame reader
// (sequence number and frame header, payload straight into the landing) and what the transport
// does with each frame, its own included (acknowledgements, credit, path changes, keep-alives,
// goodbye, abort). A peer of the job can send anything there once admitted. Rank 1's real
// transport listens on loopback; a raw rank 0 does the handshake by hand, then writes the
// input as its stream and ends it. Every frame handed to the sink must get a landing of its
// size (ASan checks it) and come back done in that landing (unless the stream ends inside
// it); once the stream ends the link must be reported failed (or left, after a goodbye)
// within a second: no crash, no hang.
// Input: a flags byte (bit 0: the hello grants credit; bits 1-3: the stream is written in
// pieces of 2^(bits) * 7 bytes, 0: at once), then the stream's bytes.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../support/tcp_rank_one.hpp"
#include "check.hpp"

namespace tcp = anview::transport::tcp;
namespace transport = anview::transport;
using Clock = std::chrono::steady_clock;

namespace {

struct Sink final : transport::FrameSink {
  std::vector<char> landing;  // exactly the frame's payload
  bool in_frame = false;
  bool failed = false;

  transport::Landing on_frame(int peer, const transport::FrameHeader& h, bool) override {
    FUZZ_CHECK(peer == 0);
    FUZZ_CHECK(!in_frame);
    landing.assign(h.payload_bytes, 0);
    in_frame = true;
    return {.data = landing.data(), .defer = false};
  }
  void on_frame_done(int peer, const transport::FrameHeader& h, void* data) override {
    FUZZ_CHECK(peer == 0 && in_frame);
    FUZZ_CHECK(h.payload_bytes == landing.size());
    FUZZ_CHECK(data == landing.data() || (h.payload_bytes == 0 && data == nullptr));
    in_frame = false;
  }
  void on_peer_failed(int peer, const anview::Error&, bool) override {
    FUZZ_CHECK(peer == 0);
    failed = true;
  }
};

// Sends all of `bytes`, driving the engine while the socket is full.
void send_all(int fd, const std::uint8_t* bytes, std::size_t size, anview::base::ProgressEngine& e,
              const Sink& sink) {
  const auto end = Clock::now() + std::chrono::seconds(2);
  while (size > 0 && !sink.failed && Clock::now() < end) {
    const ssize_t n = ::send(fd, bytes, size, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      bytes += n;
      size -= static_cast<std::size_t>(n);
    } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
      return;  // the transport closed the stream: it found something wrong
    }
    e.poll(0);
  }
}

}  // namespace

// Every input makes a new rank 1 and closes it again; the transport closes a broken stream
// first, so each input leaves one connection in TIME_WAIT for a minute on rank 1's side. Were
// each rank 1 to listen on a new ephemeral port, those would hold a port each, and at a few
// hundred inputs a second the loopback's ephemeral range (28k, half of it for bind) runs out:
// connect then fails with EADDRNOTAVAIL, which says nothing about the code under test (CI saw
// it). So every rank 1 listens on the same port (ANVIEW_TCP_PORT, SO_REUSEADDR binds over
// TIME_WAIT): the TIME_WAITs then differ only in rank 0's port, which connect may reuse.
static std::uint16_t pick_port() {
  const anview::ErrorContext ctx{.operation = "fuzz.pick_port"};
  const anview::base::Fd probe =
      anview::base::listen_tcp(anview::base::SockAddr::from_host_port("0.0.0.0", 0, ctx), 1, ctx);
  return anview::base::local_address(probe.get()).port();
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ::setenv("ANVIEW_TCP_STREAMS", "1", 1);
  ::setenv("ANVIEW_IFACES", "lo", 1);
  ::setenv("ANVIEW_MAX_FRAME", "1M", 1);  // bounds what a frame header can make us hold
  ::setenv("ANVIEW_LOG_LEVEL", "error", 0);
  ::setenv("ANVIEW_TCP_PORT", std::to_string(pick_port()).c_str(), 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const int initialized = LLVMFuzzerInitialize(nullptr, nullptr);
  (void)initialized;
  if (size < 1) return 0;
  const bool grants_credit = (data[0] & 1) != 0;
  const std::size_t piece = (data[0] >> 1 & 7) == 0 ? size : std::size_t{7} << (data[0] >> 1 & 7);
  Sink sink;
  anview::testing::TcpRankOne rank1(sink, 42);
  anview::base::ProgressEngine& engine = rank1.engine();
  // Rank 0, by hand: connect, hello, ack.
  const anview::base::Fd fd = rank1.connect(/*reset_on_close=*/true);
  FUZZ_CHECK(fd.valid());
  const tcp::Handshake hello = rank1.hello(grants_credit);
  FUZZ_CHECK(::send(fd.get(), &hello, sizeof hello, MSG_NOSIGNAL) == sizeof hello);
  FUZZ_CHECK(rank1.drive_until([&] { return rank1.transport().ready(); }, std::chrono::seconds(2)));
  tcp::Handshake ack;
  FUZZ_CHECK(anview::testing::TcpRankOne::read_exactly(fd.get(), &ack, sizeof ack));
  FUZZ_CHECK(ack.kind == tcp::HandshakeKind::ack);

  // The stream, in pieces, then its end.
  for (std::size_t at = 1; at < size && !sink.failed; at += piece)
    send_all(fd.get(), data + at, std::min(piece, size - at), engine, sink);
  ::shutdown(fd.get(), SHUT_WR);
  FUZZ_CHECK(rank1.drive_until([&] { return sink.failed; }, std::chrono::seconds(1)));
  return 0;
}
