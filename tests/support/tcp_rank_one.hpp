// Rank 1 of a two-rank job served by a real TcpTransport on loopback, and the pieces of a raw
// rank 0 that speaks the handshake by hand: for tests and fuzz targets of what a peer (or
// anyone who reaches the port) can send. Set ANVIEW_TCP_STREAMS=1 (one stream per path) and
// ANVIEW_IFACES=lo before making one.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/progress_engine.hpp"
#include "base/socket.hpp"
#include "transport/tcp/handshake.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace anview::testing {

// A sink for TcpRankOne that takes every frame into one buffer, unless told to hold them back
// (as the p2p layer does past its unexpected-message budget) or to refuse them (as it does a
// put into no region), and counts what it took.
struct TakingSink final : transport::FrameSink {
  bool hold = false;
  bool refuse = false;
  int refused = 0;
  int peer_failures = 0;
  int started = 0;
  int done = 0;
  std::vector<char> landing;

  transport::Landing on_frame(int, const transport::FrameHeader& h, bool may_defer) override {
    if (hold && may_defer) return {.data = nullptr, .defer = true};
    if (refuse) {
      ++refused;
      return {};
    }
    ++started;
    landing.resize(h.payload_bytes);
    return {.data = landing.data(), .defer = false};
  }
  void on_frame_done(int, const transport::FrameHeader&, void*) override { ++done; }
  void on_peer_failed(int, const Error&, bool) override { ++peer_failures; }
};

class TcpRankOne {
 public:
  // `peer_host`: rank 0's host id (another than rank 1's "test-host": rank 1 grants it credit).
  TcpRankOne(transport::FrameSink& sink, std::uint64_t job_id,
             const std::string& peer_host = "test-host")
      : job_id_(job_id) {
    const transport::TransportContext context{.rank = 1,
                                              .world_size = 2,
                                              .job_id = job_id,
                                              .host_id = "test-host",
                                              .timeout = std::chrono::seconds(2),
                                              .engine = &engine_,
                                              .sink = &sink};
    transport_ = std::make_unique<transport::tcp::TcpTransport>(context);
    transport::PeerInfo self;
    transport_->describe_self(self);
    const std::string& address = self.tcp_addresses.at(0);
    port_ = static_cast<std::uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
    transport_->connect({transport::PeerInfo{.rank = 0, .host_id = peer_host}});
  }

  transport::tcp::TcpTransport& transport() { return *transport_; }
  base::ProgressEngine& engine() { return engine_; }

  // A blocking socket connected to rank 1's port (what rank 0, or anyone, opens).
  // `reset_on_close`: close with a reset (no TIME_WAIT), for callers that connect very often.
  base::Fd connect(bool reset_on_close = false) const {
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(port_);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    // A fuzzer makes tens of thousands of connections a minute: closing with a reset leaves
    // no TIME_WAIT behind to exhaust the loopback's ephemeral ports (connect then fails with
    // EADDRNOTAVAIL, which says nothing about the code under test); should that happen
    // anyway, wait for ports to come free.
    for (int attempt = 0;; ++attempt) {
      base::Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      const linger reset{.l_onoff = 1, .l_linger = 0};
      if (reset_on_close) ::setsockopt(fd.get(), SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
      int err = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof to) == 0 ? 0 : errno;
      // A signal (libFuzzer's watchdog timer) interrupts the wait, not the connection, which
      // goes on by itself: wait for it here.
      if (err == EINTR) err = finish_connect(fd.get());
      if (err == 0) return fd;
      if (err != EADDRNOTAVAIL || attempt == 200) {
        std::fprintf(stderr, "TcpRankOne: connect to 127.0.0.1:%u failed: %s\n", port_,
                     std::strerror(err));
        return base::Fd();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // Reads exactly `bytes` from the blocking socket `fd` (signals do not cut it short);
  // false, after saying why on stderr, on an error, the end of the stream or 2 s passing.
  static bool read_exactly(int fd, void* data, std::size_t bytes) {
    try {
      base::read_all(fd, data, bytes, base::deadline_after(std::chrono::seconds(2)),
                     {.operation = "TcpRankOne.read_exactly"});
      return true;
    } catch (const Error& e) {
      std::fprintf(stderr, "TcpRankOne: %s\n", e.what());
      return false;
    }
  }

  // Rank 0's hello for its one stream, as TcpTransport would send it without a job secret.
  transport::tcp::Handshake hello(bool grants_credit = false) const {
    transport::tcp::Handshake h;
    h.job_id = job_id_;
    h.rank = 0;
    h.world_size = 2;
    h.stream = 0;
    h.stream_count = 1;
    transport::tcp::set_path_fields(
        h, {.path = 0, .path_count = 1, .grants_credit = grants_credit, .generation = 1});
    return h;
  }

  // Drives rank 1's progress until `done` or `limit` passes; returns done().
  bool drive_until(const std::function<bool()>& done, std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!done() && std::chrono::steady_clock::now() < end) engine_.poll(1);
    return done();
  }

 private:
  // The error of a connect that a signal interrupted, once it has finished (0: connected).
  static int finish_connect(int fd) {
    try {
      base::wait_ready(fd, POLLOUT, base::deadline_after(std::chrono::seconds(2)),
                       {.operation = "TcpRankOne.connect"}, "connect");
    } catch (const Error&) {
      return ETIMEDOUT;
    }
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    return err;
  }

  std::uint64_t job_id_;
  base::ProgressEngine engine_;  // before the transport, which uses it until it is gone
  std::unique_ptr<transport::tcp::TcpTransport> transport_;
  std::uint16_t port_ = 0;
};

}  // namespace anview::testing
