#include "transport/tcp/tcp_transport.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/config.hpp"
#include "base/log.hpp"
#include "base/process_watch.hpp"
#include "bootstrap/interfaces.hpp"

namespace anview::transport::tcp {
namespace {

const base::Setting streams_setting(
    "tcp", "ANVIEW_TCP_STREAMS", "2",
    "TCP connections per peer pair (1-64); stream 0 carries matching frames, large messages "
    "are striped over the others");
const base::Setting port_setting("tcp", "ANVIEW_TCP_PORT", "0",
                                 "TCP port the data listener binds (0: any free port)");
const base::Setting sockbuf_setting(
    "tcp", "ANVIEW_TCP_SOCKBUF", "0",
    "SO_SNDBUF/SO_RCVBUF of data connections in bytes (0: kernel autotuning)");

constexpr auto hello_timeout = std::chrono::seconds(10);

// The addresses a rank publishes, in preference order: IPv4 only for now (the others go to
// `skipped` when given).
std::vector<std::string> publishable_addresses(std::vector<std::string>* skipped) {
  std::vector<std::string> out;
  for (const auto& address : bootstrap::select_addresses(bootstrap::list_interfaces(),
                                                         bootstrap::wanted_interfaces(), true)) {
    if (address.find(':') == std::string::npos) {
      out.push_back(address);
    } else if (skipped) {
      skipped->push_back(address);
    }
  }
  return out;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

bool is_loopback(const std::string& host_port) {
  return host_port.rfind("127.", 0) == 0 || host_port.rfind("[::1]", 0) == 0;
}

}  // namespace

TransportProbe TcpTransport::probe() {
  TransportProbe p{.name = "tcp"};
  std::vector<std::string> published, skipped;
  try {
    published = publishable_addresses(&skipped);
  } catch (const Error& e) {
    p.detail = "no address to publish: " + e.cause();
    return p;
  }
  if (published.empty()) {
    p.detail = "no IPv4 address to publish (other interfaces that are up: " +
               (skipped.empty() ? std::string("none") : join(skipped)) + "; check ANVIEW_IFACES)";
    return p;
  }
  p.usable = true;
  p.detail = "would publish " + join(published);
  const auto loopback = std::count_if(published.begin(), published.end(),
                                      [](const std::string& a) { return is_loopback(a); });
  if (loopback == static_cast<std::ptrdiff_t>(published.size())) {
    p.notes.push_back("only loopback addresses: reaches ranks on this host only");
  } else if (loopback > 0) {
    p.notes.push_back("loopback addresses serve ranks on this host only");
  }
  if (!skipped.empty()) p.notes.push_back("IPv6 addresses not used (IPv4 only): " + join(skipped));
  return p;
}

TcpTransport::TcpTransport(const TransportContext& context)
    : context_(context),
      stream_count_(static_cast<int>(streams_setting.as_int())),
      sockbuf_bytes_(static_cast<int>(sockbuf_setting.as_int())) {
  if (stream_count_ < 1 || stream_count_ > 64) {
    throw Error(ErrorKind::usage,
                {.rank = context_.rank,
                 .operation = "tcp.init",
                 .cause = "ANVIEW_TCP_STREAMS=" + streams_setting.value() + " is not in 1..64"});
  }
  const auto port = port_setting.as_int();
  const ErrorContext ctx = error_context(-1, "tcp.listen");
  listener_ = base::listen_tcp(
      base::SockAddr::from_host_port("0.0.0.0", static_cast<std::uint16_t>(port), ctx), 4096, ctx);
  port_ = base::local_address(listener_.get()).port();
  for (const auto& address : publishable_addresses(nullptr))
    published_.push_back(address + ":" + std::to_string(port_));
  peers_.resize(static_cast<std::size_t>(context_.world_size));
  context_.engine->add_fd(listener_.get(), EPOLLIN, this);
  context_.engine->add_poller([this] { return poll_housekeeping(); },
                              [this] { return housekeeping_.load(std::memory_order_acquire); });
}

TcpTransport::~TcpTransport() {
  context_.engine->remove_fd(listener_.get());
  for (auto& link : peers_)
    for (auto& conn : link.streams)
      if (conn) conn->close(nullptr);
}

ErrorContext TcpTransport::error_context(int peer, const std::string& operation) const {
  ErrorContext c{.rank = context_.rank, .peer = peer, .operation = operation};
  if (peer >= 0 && static_cast<std::size_t>(peer) < peers_.size())
    c.peer_address = peers_[static_cast<std::size_t>(peer)].address;
  return c;
}

Capabilities TcpTransport::capabilities() const {
  return Capabilities{.zero_copy_receive = true,
                      .one_sided = false,
                      .streams = stream_count_,
                      .fd_driven = true,
                      .latency_us = 10.0,
                      .bandwidth_gbs = 4.0};
}

void TcpTransport::describe_self(PeerInfo& self) const {
  self.tcp_addresses = published_;
}

std::string TcpTransport::pick_address(const PeerInfo& peer, std::string* why) const {
  const bool same_host = !peer.host_id.empty() && peer.host_id == context_.host_id;
  if (same_host) {
    for (const auto& a : peer.tcp_addresses)
      if (is_loopback(a)) return a;
  }
  for (const auto& a : peer.tcp_addresses)
    if (!is_loopback(a)) return a;
  if (why) {
    *why = peer.tcp_addresses.empty()
               ? "rank " + std::to_string(peer.rank) + " published no TCP address"
               : "rank " + std::to_string(peer.rank) +
                     " is on another host and published only loopback addresses (check "
                     "ANVIEW_IFACES there)";
  }
  return {};
}

bool TcpTransport::can_reach(const PeerInfo& peer, std::string* why) const {
  return !pick_address(peer, why).empty();
}

void TcpTransport::connect(const std::vector<PeerInfo>& peers) {
  const base::Deadline deadline = base::deadline_after(context_.timeout);
  for (const auto& peer : peers) {
    PeerLink& link = peers_[static_cast<std::size_t>(peer.rank)];
    link.served = true;
    link.streams.resize(static_cast<std::size_t>(stream_count_));
    watch_process(peer);
    if (peer.rank <= context_.rank) continue;  // the lower rank connects
    link.address = pick_address(peer, nullptr);
    ErrorContext ctx = error_context(peer.rank, "connect");
    const auto addr = base::SockAddr::parse(link.address, ctx);
    for (int s = 0; s < stream_count_; ++s) {
      base::Fd fd = base::connect_tcp(addr, deadline, ctx);
      if (sockbuf_bytes_ > 0) base::set_buffer_sizes(fd.get(), sockbuf_bytes_);
      Handshake hello;
      hello.job_id = context_.job_id;
      hello.rank = static_cast<std::uint32_t>(context_.rank);
      hello.world_size = static_cast<std::uint32_t>(context_.world_size);
      hello.stream = static_cast<std::uint16_t>(s);
      hello.stream_count = static_cast<std::uint16_t>(stream_count_);
      base::write_all(fd.get(), &hello, sizeof hello, deadline, ctx);
      link.streams[static_cast<std::size_t>(s)] = std::make_unique<Connection>(
          *this, std::move(fd), Connection::State::awaiting_ack, peer.rank, s);
    }
  }
}

void TcpTransport::watch_process(const PeerInfo& peer) {
  if (peer.pid <= 0 || peer.rank == context_.rank || peer.host_id != context_.host_id) return;
  std::string why;
  const int rank = peer.rank;
  auto watch = base::ProcessWatch::start(
      *context_.engine, peer.pid, [this, rank] { on_peer_process_exit(rank); }, &why);
  // Without a watch (an old kernel, a sandbox) the end of the stream still tells, later.
  if (!watch) base::log("tcp", base::LogLevel::debug, "tcp: cannot watch rank ", rank, ": ", why);
  peers_[static_cast<std::size_t>(rank)].exit_watch = std::move(watch);
}

void TcpTransport::on_peer_process_exit(int peer) {
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  base::log("tcp", base::LogLevel::debug, "tcp: the process of rank ", peer, " ended");
  for (auto& conn : link.streams)
    if (conn && conn->state() == Connection::State::established) conn->drain();
}

bool TcpTransport::ready() const {
  for (const auto& link : peers_)
    if (link.served && !link.failed && !link.was_up) return false;
  return true;
}

std::optional<Error> TcpTransport::setup_failure() const {
  for (const auto& link : peers_)
    if (link.setup_error) return link.setup_error;
  return std::nullopt;
}

void TcpTransport::count_established(PeerLink& link) {
  if (++link.established == stream_count_) link.was_up = true;
}

std::string TcpTransport::pending_connections() const {
  std::string text;
  for (std::size_t r = 0; r < peers_.size(); ++r) {
    const PeerLink& link = peers_[r];
    if (!link.served || link.failed || link.was_up) continue;
    if (!text.empty()) text += ", ";
    text += "rank " + std::to_string(r) + " (" + std::to_string(link.established) + "/" +
            std::to_string(stream_count_) + " streams, " +
            (static_cast<int>(r) > context_.rank ? "we connect" : "it connects") + ")";
  }
  return text;
}

void TcpTransport::on_fd_events(std::uint32_t) {
  accept_pending();
}

void TcpTransport::accept_pending() {
  for (;;) {
    const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        base::log("tcp", base::LogLevel::warn, "tcp: accept() failed: ", base::errno_text(errno));
      return;
    }
    if (sockbuf_bytes_ > 0) base::set_buffer_sizes(fd, sockbuf_bytes_);
    housekeeping_.store(true, std::memory_order_release);
    accepting_.push_back(std::make_unique<Connection>(*this, base::Fd(fd),
                                                      Connection::State::awaiting_hello, -1, -1));
    accepting_deadlines_.push_back(base::deadline_after(hello_timeout));
  }
}

namespace {

// Answers a hello on a fresh socket. 32 bytes always fit an empty socket buffer.
bool send_reply(int fd, const Handshake& reply) {
  return ::send(fd, &reply, sizeof reply, MSG_NOSIGNAL | MSG_DONTWAIT) ==
         static_cast<ssize_t>(sizeof reply);
}

}  // namespace

void TcpTransport::on_hello(Connection& conn, const Handshake& hello) {
  auto it = std::find_if(accepting_.begin(), accepting_.end(),
                         [&](const auto& c) { return c.get() == &conn; });
  if (it == accepting_.end()) return;
  const std::size_t index = static_cast<std::size_t>(it - accepting_.begin());
  std::unique_ptr<Connection> owned = std::move(*it);
  accepting_.erase(it);
  accepting_deadlines_.erase(accepting_deadlines_.begin() + static_cast<std::ptrdiff_t>(index));

  const std::string& from = conn.remote();
  bool foreign = false;
  std::string why;
  RejectReason reason = check_hello(
      hello,
      {context_.job_id, static_cast<std::uint32_t>(context_.world_size),
       static_cast<std::uint32_t>(context_.rank), static_cast<std::uint16_t>(stream_count_)},
      &foreign, &why);
  PeerLink* link = nullptr;
  if (reason == RejectReason::none) {
    link = &peers_[hello.rank];
    if (closing_) {
      reason = RejectReason::closing;
      why = "this rank is shutting down";
    } else if (!link->served || link->failed || link->streams[hello.stream]) {
      reason = RejectReason::duplicate;
      why = "stream " + std::to_string(hello.stream) + " of rank " + std::to_string(hello.rank) +
            " is already connected or closed";
    }
  }
  if (reason != RejectReason::none) {
    base::log("tcp", base::LogLevel::warn, "tcp: dropped a connection from ", from, ": ", why);
    if (!foreign) {
      Handshake reject;
      reject.kind = HandshakeKind::reject;
      reject.job_id = context_.job_id;
      reject.rank = static_cast<std::uint32_t>(context_.rank);
      reject.world_size = static_cast<std::uint32_t>(context_.world_size);
      reject.reason = reason;
      send_reply(conn.fd(), reject);
    }
    owned->close(nullptr);
    retire(std::move(owned));
    return;
  }
  Handshake ack;
  ack.kind = HandshakeKind::ack;
  ack.job_id = context_.job_id;
  ack.rank = static_cast<std::uint32_t>(context_.rank);
  ack.world_size = static_cast<std::uint32_t>(context_.world_size);
  ack.stream = hello.stream;
  ack.stream_count = hello.stream_count;
  if (!send_reply(conn.fd(), ack)) {
    base::log("tcp", base::LogLevel::warn, "tcp: could not answer the hello of rank ", hello.rank,
              " from ", from, ": ", base::errno_text(errno));
    owned->close(nullptr);
    retire(std::move(owned));
    return;
  }
  link->address = from;
  owned->set_established(static_cast<int>(hello.rank), hello.stream);
  link->streams[hello.stream] = std::move(owned);
  count_established(*link);
}

void TcpTransport::on_ack(Connection& conn, const Handshake& reply) {
  const int peer = conn.peer();
  ErrorContext ctx = error_context(peer, "connect");
  if (reply.magic != handshake_magic ||
      (reply.kind != HandshakeKind::ack && reply.kind != HandshakeKind::reject)) {
    ctx.cause = "rank " + std::to_string(peer) +
                " answered the handshake with bytes that are not "
                "an Anview handshake";
    fail_link(peer, Error(ErrorKind::protocol, std::move(ctx)));
    return;
  }
  if (reply.kind == HandshakeKind::reject) {
    ctx.cause = explain_reject(reply, peer);
    fail_link(peer, Error(ErrorKind::protocol, std::move(ctx)));
    return;
  }
  if (reply.version != protocol_version || reply.job_id != context_.job_id ||
      reply.rank != static_cast<std::uint32_t>(peer) || reply.stream != conn.stream()) {
    ctx.cause = "rank " + std::to_string(peer) + " acknowledged with mismatching fields (version " +
                std::to_string(reply.version) + ", rank " + std::to_string(reply.rank) + ")";
    fail_link(peer, Error(ErrorKind::protocol, std::move(ctx)));
    return;
  }
  conn.set_established(peer, conn.stream());
  count_established(peers_[static_cast<std::size_t>(peer)]);
}

Landing TcpTransport::deliver_frame(Connection& conn, const FrameHeader& header, bool may_defer) {
  if (header.type >= frame_goodbye) {
    const bool known = header.type == frame_goodbye || header.type == frame_abort;
    if (!known || header.payload_bytes != 0) {
      ErrorContext ctx = error_context(conn.peer(), "transfer");
      ctx.cause = "unknown transport frame type " + std::to_string(header.type);
      fail_link(conn.peer(), Error(ErrorKind::protocol, std::move(ctx)));
      return {};
    }
    if (header.type == frame_abort) {
      // The peer lost another rank and gives up its link to us: name that rank.
      ErrorContext ctx = error_context(conn.peer(), "transfer");
      const bool named = header.arg < static_cast<std::uint64_t>(context_.world_size) &&
                         static_cast<int>(header.arg) != conn.peer() &&
                         static_cast<int>(header.arg) != context_.rank;
      if (named) ctx.peer = static_cast<int>(header.arg);
      ctx.cause = "rank " + std::to_string(conn.peer()) + " closed its link to this rank" +
                  (named ? " after it lost rank " + std::to_string(header.arg) : std::string());
      fail_link(conn.peer(), Error(ErrorKind::peer_lost, std::move(ctx)));
      return {};
    }
    conn.mark_goodbye();
    return {};
  }
  if (closing_) {
    discard_.resize(header.payload_bytes);
    return Landing{discard_.data(), false};
  }
  Landing landing = context_.sink->on_frame(conn.peer(), header, may_defer);
  if (!landing.defer && landing.data == nullptr && header.payload_bytes > 0) {
    discard_.resize(header.payload_bytes);  // the sink failed the frame; consume it
    landing.data = discard_.data();
  }
  return landing;
}

void TcpTransport::deliver_frame_done(Connection& conn, const FrameHeader& header, void* data) {
  if (header.type >= frame_goodbye || closing_) return;
  if (data == discard_.data() && header.payload_bytes > 0) return;
  context_.sink->on_frame_done(conn.peer(), header, data);
}

void TcpTransport::on_connection_error(Connection& conn, const Error& error) {
  if (conn.peer() < 0 || conn.state() == Connection::State::awaiting_hello) {
    // Not one of our peers yet: garbage, a port scanner, a foreign program. Drop it.
    base::log("tcp", base::LogLevel::warn, "tcp: dropped a connection from ", conn.remote(),
              " before its handshake: ", error.cause());
    auto it = std::find_if(accepting_.begin(), accepting_.end(),
                           [&](const auto& c) { return c.get() == &conn; });
    if (it != accepting_.end()) {
      const auto index = it - accepting_.begin();
      std::unique_ptr<Connection> owned = std::move(*it);
      accepting_.erase(it);
      accepting_deadlines_.erase(accepting_deadlines_.begin() + index);
      owned->close(nullptr);
      retire(std::move(owned));
    }
    return;
  }
  fail_link(conn.peer(), error);
}

void TcpTransport::on_connection_eof(Connection& conn) {
  const int peer = conn.peer();
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  if (link.draining) return;  // an end of stream met while draining: the caller goes on
  if (!conn.goodbye_received()) {
    // The process is gone. What it sent before it died is in our sockets: read every stream
    // to its end first, so complete messages are still delivered, then fail the link.
    link.draining = true;
    for (auto& other : link.streams)
      if (other && other.get() != &conn) other->drain();
    link.draining = false;
    ErrorContext ctx = error_context(peer, "transfer");
    ctx.cause = "connection closed by rank " + std::to_string(peer) +
                " without a goodbye: the process exited or was killed";
    fail_link(peer, Error(ErrorKind::peer_lost, std::move(ctx)));
    return;
  }
  conn.half_close();  // the peer leaves: let it see our end of the stream too
  if (++link.eof_streams < stream_count_) return;
  ErrorContext ctx = error_context(peer, "transfer");
  ctx.cause = "rank " + std::to_string(peer) + " closed its communicator";
  link.goodbye = true;
  fail_link(peer, Error(ErrorKind::peer_lost, std::move(ctx)));
}

void TcpTransport::fail_link(int peer, const Error& error) {
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  if (link.failed) return;
  link.failed = true;
  if (!link.was_up) link.setup_error = error;
  if (link.goodbye || closing_) {
    base::log("tcp", base::LogLevel::debug, "tcp: link to rank ", peer, " closed: ", error.cause());
  } else {
    base::log("tcp", base::LogLevel::error, error.what());
  }
  for (auto& conn : link.streams) {
    if (!conn) continue;
    conn->close(&error);
    retire(std::move(conn));
  }
  if (!closing_) context_.sink->on_peer_failed(peer, error, link.goodbye);
}

void TcpTransport::fail_peer(int peer, const Error& error) {
  // The layer above gives up the link (a failed operation, often because another rank was
  // lost): tell the peer why before closing, so it can name the rank that started it.
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  if (!link.failed && !link.streams.empty() && link.streams[0]) {
    FrameHeader abort;
    abort.type = frame_abort;
    const int cause = error.context().peer;
    abort.arg = cause >= 0 && cause != peer ? static_cast<std::uint64_t>(cause) : ~std::uint64_t{0};
    link.streams[0]->try_send_now(abort);
  }
  fail_link(peer, error);
}

void TcpTransport::retire(std::unique_ptr<Connection> conn) {
  retired_.push_back(std::move(conn));
  housekeeping_.store(true, std::memory_order_release);
}

void TcpTransport::want_resume(Connection& conn) {
  resume_wanted_.push_back(&conn);
  housekeeping_.store(true, std::memory_order_release);
  context_.engine->wakeup();
}

void TcpTransport::resume(int peer) {
  for (auto& conn : peers_[static_cast<std::size_t>(peer)].streams)
    if (conn && conn->paused()) want_resume(*conn);
}

bool TcpTransport::poll_housekeeping() {
  if (!retired_.empty()) retired_.clear();
  if (!accepting_.empty()) {
    const auto now = base::Clock::now();
    for (std::size_t i = 0; i < accepting_.size();) {
      if (now < accepting_deadlines_[i]) {
        ++i;
        continue;
      }
      base::log("tcp", base::LogLevel::warn, "tcp: dropped a connection from ",
                accepting_[i]->remote(), ": no handshake within ", hello_timeout.count(), " s");
      accepting_[i]->close(nullptr);
      retire(std::move(accepting_[i]));
      accepting_.erase(accepting_.begin() + static_cast<std::ptrdiff_t>(i));
      accepting_deadlines_.erase(accepting_deadlines_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  // Connections waiting for a hello need their deadline checked on later rounds too.
  housekeeping_.store(!accepting_.empty(), std::memory_order_release);
  if (resume_wanted_.empty()) return false;
  std::vector<Connection*> wanted;
  wanted.swap(resume_wanted_);
  for (Connection* conn : wanted) {
    // A connection asked for may have failed meanwhile; only live ones are resumed.
    for (auto& link : peers_)
      for (auto& c : link.streams)
        if (c.get() == conn) conn->resume_reading();
  }
  return true;
}

Connection& TcpTransport::pick_stream(PeerLink& link, Ordering ordering) {
  if (ordering == Ordering::ordered || stream_count_ == 1) return *link.streams[0];
  // Bulk data keeps off stream 0 when there are others: matching frames there then never
  // wait behind megabytes of payload, and a receiver that stops reading stream 0 (its
  // unexpected-message budget is full) still receives the data of matched messages.
  Connection* best = link.streams[1].get();
  for (std::size_t s = 2; s < link.streams.size(); ++s)
    if (link.streams[s]->queued_bytes() < best->queued_bytes()) best = link.streams[s].get();
  return *best;
}

void TcpTransport::post_send(int peer, const FrameHeader& header, const void* payload,
                             Ordering ordering, SendDone done) {
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  if (link.failed || link.established < stream_count_ || closing_) {
    ErrorContext ctx = error_context(peer, "send");
    ctx.cause = link.failed ? "the link to rank " + std::to_string(peer) + " is closed"
                            : "the link to rank " + std::to_string(peer) + " is not up";
    const Error error(ErrorKind::link, std::move(ctx));
    done(&error);
    return;
  }
  pick_stream(link, ordering).queue_send(header, payload, std::move(done));
}

void TcpTransport::shutdown(base::Deadline deadline) {
  closing_ = true;
  FrameHeader goodbye;
  goodbye.type = frame_goodbye;
  for (auto& link : peers_) {
    if (!link.served || link.failed) continue;
    for (auto& conn : link.streams) {
      if (!conn || conn->state() != Connection::State::established) continue;
      conn->queue_send(goodbye, nullptr, nullptr);
      if (conn) conn->half_close();  // a failed write retires the whole link
    }
  }
  // Drive the engine until every peer has seen our goodbye and closed its side too (closing
  // before that could turn unread data into a reset), or until the deadline.
  auto settled = [this] {
    for (const auto& link : peers_)
      for (const auto& conn : link.streams)
        if (conn && conn->state() != Connection::State::closed && !conn->eof()) return false;
    return true;
  };
  while (!settled() && base::Clock::now() < deadline) context_.engine->poll(10);
  for (auto& link : peers_)
    for (auto& conn : link.streams)
      if (conn) conn->close(nullptr);
}

void TcpTransport::collect_metrics(base::metrics::Sink& sink,
                                   const base::metrics::Labels& labels) const {
  for (std::size_t p = 0; p < peers_.size(); ++p) {
    for (const auto& conn : peers_[p].streams) {
      if (!conn) continue;
      base::metrics::Labels l = labels;
      l.emplace_back("peer", std::to_string(p));
      l.emplace_back("stream", std::to_string(conn->stream()));
      l.emplace_back("path", conn->describe());
      auto with = [&](const char* direction) {
        auto d = l;
        d.emplace_back("direction", direction);
        return d;
      };
      sink.counter("anview_tcp_stream_bytes_total", "Bytes through a TCP stream's socket",
                   with("sent"), static_cast<double>(conn->bytes_sent()));
      sink.counter("anview_tcp_stream_bytes_total", "Bytes through a TCP stream's socket",
                   with("received"), static_cast<double>(conn->bytes_received()));
      sink.gauge("anview_tcp_stream_queued_bytes",
                 "Bytes queued on a TCP stream that the socket has not taken yet", l,
                 static_cast<double>(conn->queued_bytes()));
      sink.gauge("anview_tcp_stream_reading_paused",
                 "1 while a TCP stream is not read (the receiver's unexpected-message budget "
                 "is full: flow control)",
                 l, conn->paused() ? 1 : 0);
    }
  }
}

std::string TcpTransport::describe_peer(int peer) const {
  const PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  std::string text = "tcp " + (link.address.empty() ? std::string("?") : link.address) + ", " +
                     std::to_string(stream_count_) + " stream" + (stream_count_ > 1 ? "s" : "");
  if (link.failed) text += " (closed)";
  return text;
}

}  // namespace anview::transport::tcp
