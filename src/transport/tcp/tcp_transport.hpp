// The TCP transport: one listening socket per rank, `ANVIEW_TCP_STREAMS` connections per peer
// pair (the lower rank connects), a versioned handshake, and frames over non-blocking sockets
// driven by the progress engine's epoll. Matching frames travel on stream 0 so they keep their
// order; bulk data frames go to the stream with the least queued bytes.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "base/process_watch.hpp"
#include "transport/tcp/connection.hpp"
#include "transport/transport.hpp"

namespace anview::transport::tcp {

class TcpTransport final : public Transport, private base::FdHandler {
 public:
  explicit TcpTransport(const TransportContext& context);
  ~TcpTransport() override;

  // What anview-info reports: the addresses it would publish, or why there are none.
  static TransportProbe probe();

  std::string_view name() const override { return "tcp"; }
  Capabilities capabilities() const override;
  void describe_self(PeerInfo& self) const override;
  bool can_reach(const PeerInfo& peer, std::string* why) const override;
  void connect(const std::vector<PeerInfo>& peers) override;
  bool ready() const override;
  std::optional<Error> setup_failure() const override;
  std::string pending_connections() const override;
  void post_send(int peer, const FrameHeader& header, const void* payload, Ordering ordering,
                 SendDone done) override;
  void resume(int peer) override;
  void fail_peer(int peer, const Error& error) override;
  void shutdown(base::Deadline deadline) override;
  std::string describe_peer(int peer) const override;
  void collect_metrics(base::metrics::Sink& sink,
                       const base::metrics::Labels& labels) const override;

  // --- called by Connection ---
  void on_hello(Connection& conn, const Handshake& hello);
  void on_ack(Connection& conn, const Handshake& reply);
  Landing deliver_frame(Connection& conn, const FrameHeader& header, bool may_defer);
  void deliver_frame_done(Connection& conn, const FrameHeader& header, void* data);
  void on_connection_error(Connection& conn, const Error& error);
  void on_connection_eof(Connection& conn);
  void want_resume(Connection& conn);
  base::ProgressEngine& engine() { return *context_.engine; }
  ErrorContext error_context(int peer, const std::string& operation) const;

 private:
  struct PeerLink {
    bool served = false;  // this transport serves the peer
    std::string address;  // "ip:port" we connect to or were connected from
    std::vector<std::unique_ptr<Connection>> streams;
    int established = 0;
    int eof_streams = 0;
    bool goodbye = false;  // the peer said it is leaving
    bool failed = false;
    bool draining = false;                           // reading the other streams of a dead peer
    bool was_up = false;                             // every stream was established once
    std::optional<Error> setup_error;                // failed before it was up
    std::unique_ptr<base::ProcessWatch> exit_watch;  // pidfd of a same-host peer
  };
  void count_established(PeerLink& link);
  void watch_process(const PeerInfo& peer);

 public:
  // A same-host peer's process ended: read its streams to the end, past any budget (a
  // paused reader would otherwise never see the end of a stream the dead peer's kernel
  // still holds data for).
  void on_peer_process_exit(int peer);

 private:
  void on_fd_events(std::uint32_t events) override;  // the listening socket
  void accept_pending();
  bool poll_housekeeping();
  void fail_link(int peer, const Error& error);
  void retire(std::unique_ptr<Connection> conn);
  Connection& pick_stream(PeerLink& link, Ordering ordering);
  std::string pick_address(const PeerInfo& peer, std::string* why) const;

  TransportContext context_;
  int stream_count_;
  int sockbuf_bytes_;  // ANVIEW_TCP_SOCKBUF, read once
  base::Fd listener_;
  std::uint16_t port_ = 0;
  std::vector<std::string> published_;  // our addresses, "ip:port"
  std::vector<PeerLink> peers_;
  std::vector<std::unique_ptr<Connection>> accepting_;  // waiting for a hello
  std::vector<base::Deadline> accepting_deadlines_;
  std::vector<std::unique_ptr<Connection>> retired_;  // closed; freed on the next poll
  std::vector<Connection*> resume_wanted_;
  // Something above needs poll_housekeeping() (a lock-free hint for the spinning driver).
  std::atomic<bool> housekeeping_{false};
  bool closing_ = false;
  std::vector<char> discard_;  // landing for frames that arrive while closing
};

}  // namespace anview::transport::tcp
