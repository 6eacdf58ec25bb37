// The TCP transport: one listening socket per rank and, towards each peer, one or more network
// paths (pairs of interfaces, paths.hpp), each with `ANVIEW_TCP_STREAMS` connections (the lower
// rank connects), a versioned handshake, and frames over non-blocking sockets driven by the
// progress engine's epoll.
//
// One path: matching frames travel on stream 0 so they keep their order; bulk data frames go to
// the stream with the least queued bytes. Several paths (a peer on another host reachable
// through several interfaces): every frame is numbered and kept until the peer acknowledges it;
// data chunks are pulled by whichever stream has room, so each path carries what it can; a path
// that fails (reset, end of stream, or no acknowledgement from the kernel past
// ANVIEW_TCP_PATH_TIMEOUT) has its unacknowledged frames sent again on the others, and the
// receiver drops the copies it already has. The connecting side probes a failed path and
// re-admits it when it works again. The link fails only when every path has.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/auth.hpp"
#include "base/limits.hpp"
#include "base/process_watch.hpp"
#include "transport/tcp/connection.hpp"
#include "transport/tcp/paths.hpp"
#include "transport/tcp/sequence.hpp"
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
  // The handshake (admission.cpp).
  void on_hello(Connection& conn, const Handshake& hello);
  void on_proof(Connection& conn, const Handshake& proof);
  void on_ack(Connection& conn, const Handshake& reply);
  void on_admission(Connection& conn, const Handshake& reply);
  Landing deliver_frame(Connection& conn, const WireHeader& header, bool may_defer);
  void deliver_frame_done(Connection& conn, const WireHeader& header, void* data);
  void on_frame_interrupted(Connection& conn, const WireHeader& header, char* landing);
  void on_connection_error(Connection& conn, const Error& error);
  void on_connection_eof(Connection& conn);
  void on_stream_room(Connection& conn);  // its send queue drained some
  void on_read_idle(Connection& conn);    // it read what the socket had
  void want_resume(Connection& conn);
  base::ProgressEngine& engine() { return *context_.engine; }
  std::uint32_t max_frame() const { return max_frame_; }        // ANVIEW_MAX_FRAME
  const base::tls::Context* tls() const { return tls_.get(); }  // null without ANVIEW_TLS
  // The reject a TLS listener sends in plain text to a peer without TLS.
  Handshake plaintext_reject() const;
  ErrorContext error_context(int peer, const std::string& operation) const;

  // A same-host peer's process ended: read its streams to the end, past any budget (a
  // paused reader would otherwise never see the end of a stream the dead peer's kernel
  // still holds data for).
  void on_peer_process_exit(int peer);

 private:
  struct Path {
    enum class State { connecting, up, failed };
    PathPlan plan;  // the connecting side's plan; the accepting side knows the remote only
    std::vector<std::unique_ptr<Connection>> streams;
    State state = State::connecting;
    int established = 0;
    std::uint16_t generation = 0;  // of its current connections
    // Failed in `down_generation`, as this side told the peer (frame_path_down) on the paths
    // up then; until it is up again, a path that comes up tells the peer first as well.
    bool told_down = false;
    std::uint16_t down_generation = 0;
    bool first_attempt = true;  // not up yet, and no attempt failed yet
    bool ever_up = false;
    // Came up, or failed an attempt made while the peer was known to listen: start-up need
    // not wait for it any longer.
    bool settled = false;
    base::Deadline connect_deadline{};
    base::Deadline next_probe{};
    std::chrono::milliseconds probe_backoff{0};
    std::string last_failure;
    std::uint64_t failures = 0;
    std::uint64_t resent_frames = 0;
    std::uint64_t retired_bytes = 0;  // sent by its earlier connections
    // Statistics, refreshed by the periodic check.
    std::uint32_t rtt_us = 0;
    double rate = 0;      // bytes per second sent, smoothed
    double capacity = 0;  // bytes per second it can deliver (kernel estimate); 0: unknown
    std::uint64_t rate_bytes = 0;
    base::Clock::time_point rate_at{};
    std::vector<base::Clock::time_point> outstanding_since;  // per stream: unacked data seen
    std::uint64_t keepalive_frames = 0;  // frames queued on stream 0 when last seen moving
    base::Clock::time_point keepalive_at{};
    std::uint64_t bytes_sent() const;
    std::string describe() const;
  };

  // A frame kept until the peer acknowledges it (several paths only).
  struct Unacked {
    std::uint64_t seq = 0;
    FrameHeader header;
    const char* payload = nullptr;  // the caller's (data chunks) or `copy` (ordered frames)
    std::unique_ptr<char[]> copy;
    SendDone done;  // ordered: when first written; data chunks: when acknowledged
    int path = -1;  // where it was last queued; -1: waiting for a path
    // Queued again after its path failed: a copy may sit in another stream's queue when the
    // first copy's acknowledgement lets `payload` go (Connection::withdraw).
    bool resent = false;
  };

  struct PeerLink {
    bool served = false;     // this transport serves the peer
    bool connector = false;  // we connect (the lower rank)
    bool same_host = false;  // the peer runs on this host
    std::string address;     // the remote address of the first path, for messages
    std::vector<Path> paths;
    int control = -1;  // the path whose stream 0 carries ordered frames
    int eof_streams = 0;
    bool goodbye = false;  // the peer said it is leaving
    bool failed = false;
    bool draining = false;                           // reading the other streams of a dead peer
    bool was_up = false;                             // a path was up once
    std::optional<Error> setup_error;                // failed before it was up
    std::unique_ptr<base::ProcessWatch> exit_watch;  // pidfd of a same-host peer
    // Several paths: sending.
    bool reliable = false;
    std::uint64_t next_ordered = 0;
    std::uint64_t next_chunk = 0;
    std::deque<Unacked> ordered_unacked;    // by seq, contiguous
    std::deque<Unacked> chunk_unacked;      // by chunk number, contiguous
    std::deque<std::uint64_t> chunk_queue;  // chunk numbers waiting for a stream
    bool feeding = false;
    // Several paths: receiving.
    std::uint64_t ordered_started = 0;  // handed to the sink
    std::uint64_t ordered_done = 0;     // arrived whole
    SeqSet chunks_started;
    SeqSet chunks_done;
    // seq -> a frame cut off midway: its header (a copy must announce the same frame) and its
    // landing (null: the sink refused it)
    struct CutOff {
      FrameHeader header;
      char* landing = nullptr;
    };
    std::map<std::uint64_t, CutOff> interrupted;
    // Flow control.
    bool peer_grants = false;           // the peer grants credit: our data streams wait for it
    base::Clock::time_point data_at{};  // when data last arrived from the peer
    std::uint64_t unacked_frames = 0;   // ordered frames taken since our last ack
    std::uint64_t unacked_bytes = 0;
    bool ack_due = false;
  };

  void count_established(int peer, int path);
  void watch_process(const PeerInfo& peer);
  void on_fd_events(std::uint32_t events) override;  // the listening socket
  void accept_pending();
  // Admission (admission.cpp): whether a hello may have its stream, with no change of state;
  // then taking the stream into its peer's path.
  RejectReason admission(const Handshake& hello, bool* foreign, std::string* why) const;
  bool replaces_path(const PeerLink& link, const PathFields& fields) const;
  void admit(std::unique_ptr<Connection> conn, const Handshake& hello);
  std::unique_ptr<Connection> take_accepting(Connection& conn);
  std::unique_ptr<Connection> take_accepting_at(std::size_t index);  // accepting_[index]
  void drop_accepted(std::unique_ptr<Connection> conn);
  // Drops accepting_[index] (a flood, an idler, a timeout), logged within drops_'s bounds.
  void drop_pending(std::size_t index, const std::string& why);
  // Our answer to `hello` of `kind`: our job id, rank and world size, its stream numbers.
  Handshake reply_to(const Handshake& hello, HandshakeKind kind) const;
  // Answers with a reject (not to foreign bytes), then drops the connection.
  void reject_accepted(Connection& conn, const Handshake& hello, RejectReason reason,
                       const std::string& why, bool foreign);
  // The connecting side's end of a handshake: the stream is up.
  void established(Connection& conn, const Handshake& reply);
  // The connecting side gives up a handshake: one failed attempt of a path probed again; at
  // setup, the link fails with `kind`.
  void refuse(Connection& conn, ErrorKind kind, std::string cause);
  // Logs a failed proof once per remote host.
  void log_auth_failure(const std::string& remote, const std::string& why);
  bool poll_housekeeping();
  void periodic_check();
  void check_path(int peer, int path, base::Clock::time_point now);
  void fail_link(int peer, const Error& error);
  void retire(std::unique_ptr<Connection> conn);
  Connection* pick_stream(PeerLink& link, Ordering ordering);
  std::vector<PathPlan> plan_for(const PeerInfo& peer) const;
  Handshake make_hello(const PeerLink& link, int stream, int path, std::uint16_t generation) const;
  void configure_socket(int fd) const;
  // Several paths.
  void start_path(int peer, int path);
  void path_attempt_failed(int peer, int path, const std::string& cause);
  void path_failed(int peer, int path, const std::string& cause, bool tell_peer);
  // frame_path_down for path `index` failed in `generation`, on every stream of `carrier`.
  void tell_path_down(Path& carrier, int index, std::uint16_t generation);
  // On path `index`, just up: the news of every path this side told the peer had failed.
  void tell_failed_paths(PeerLink& link, int index);
  void close_path_streams(Path& path, const Error& error);
  bool other_path_up(const PeerLink& link, int path) const;
  int best_control_path(const PeerLink& link) const;
  void queue_ordered(int peer, Unacked& entry);
  void pump_ordered(int peer);
  void feed(int peer);
  void send_ack(int peer);
  // Flow control (flow_control.cpp).
  Connection* control_frame_stream(PeerLink& link);
  void start_credit(PeerLink& link, Connection& conn);
  // Whether we limit `link`'s data streams towards us with credit: not over loopback, where
  // no network queue builds up and the receiver's memory is bounded anyway.
  bool grants_credit(const PeerLink& link) const { return credit_bytes_ > 0 && !link.same_host; }
  // Sends `conn`'s peer a grant up to `limit` (and records it) when a stream can carry it.
  void grant_credit(Connection& conn, std::uint64_t limit);
  void grant_if_due(PeerLink& link, Connection& conn, base::Clock::time_point now);
  // A path came up: grants that found no stream to carry them go out now.
  void grants_after_path_up(PeerLink& link);
  // A path failed: the grants of the streams left go again on the streams left. Those that
  // went out on the failed path (all of them travel on the control path) may be lost with it,
  // and a sender that used up its credit would wait for them while we wait for its data.
  void grants_after_path_failed(PeerLink& link);
  // `fn` for each established data stream of `link` whose peer we grant credit (of the paths
  // up only, or of every path).
  void each_granted_stream(PeerLink& link, bool up_paths_only,
                           const std::function<void(Connection&)>& fn);
  int active_senders(base::Clock::time_point now) const;
  void on_acknowledged(int peer, std::uint64_t ordered, std::uint64_t chunks);
  // Takes the copies of an acknowledged frame that was sent again out of the stream queues.
  // True when one was dropped from a queue (the stream has room).
  bool withdraw_copies(PeerLink& link, const Unacked& entry);
  void on_ordered_written(int peer, std::uint64_t seq);
  Landing deliver_sequenced(Connection& conn, PeerLink& link, const WireHeader& header,
                            bool may_defer);
  Landing deliver_transport_frame(Connection& conn, const WireHeader& header);
  std::string describe_paths(const PeerLink& link) const;
  void set_next_tick(base::Clock::time_point when);

  TransportContext context_;
  int stream_count_;
  int sockbuf_bytes_;  // ANVIEW_TCP_SOCKBUF, read once
  int max_paths_;      // ANVIEW_TCP_PATHS
  std::chrono::milliseconds path_timeout_;
  std::chrono::milliseconds link_timeout_;
  std::string congestion_control_;               // ANVIEW_TCP_CC; empty: the kernel's default
  std::uint64_t credit_bytes_;                   // ANVIEW_TCP_CREDIT; 0: no flow control
  std::uint32_t max_frame_;                      // ANVIEW_MAX_FRAME
  std::chrono::milliseconds handshake_timeout_;  // ANVIEW_HANDSHAKE_TIMEOUT
  std::size_t max_pending_;                      // ANVIEW_MAX_PENDING_CONNECTIONS
  base::Fd listener_;
  std::uint16_t port_ = 0;
  std::vector<std::string> published_;  // our addresses, "ip:port"
  std::vector<LocalAddress> local_addresses_;
  std::vector<PeerLink> peers_;
  base::auth::Secret secret_;                      // the job's secret (ANVIEW_SECRET); empty: none
  std::shared_ptr<const base::tls::Context> tls_;  // ANVIEW_TLS=1; null: plain TCP
  base::auth::FailureLog auth_failures_;
  std::vector<std::unique_ptr<Connection>> accepting_;  // waiting for a hello or a proof
  std::vector<base::Deadline> accepting_deadlines_;
  base::limits::DropLog drops_;  // connections dropped before their handshake was done
  // Out of descriptors: the listener is left alone until then (accepting would only spin).
  std::optional<base::Deadline> listener_paused_until_;
  std::vector<std::unique_ptr<Connection>> retired_;  // closed; freed on the next poll
  std::vector<Connection*> resume_wanted_;
  // Something above needs poll_housekeeping() (a lock-free hint for the spinning driver).
  std::atomic<bool> housekeeping_{false};
  // Links with several paths need a periodic check (path health, probes, keepalives).
  std::atomic<bool> multipath_{false};
  std::atomic<std::int64_t> next_tick_ns_{0};
  bool closing_ = false;
};

}  // namespace anview::transport::tcp
