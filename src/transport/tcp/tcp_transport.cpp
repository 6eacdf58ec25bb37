#include "transport/tcp/tcp_transport.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "base/config.hpp"
#include "base/log.hpp"
#include "base/process_watch.hpp"
#include "bootstrap/interfaces.hpp"
#include "transport/tcp/multipath.hpp"

namespace anview::transport::tcp {
namespace {

const base::Setting streams_setting(
    "tcp", "ANVIEW_TCP_STREAMS", "2",
    "TCP connections per network path to a peer (1-64); stream 0 carries matching frames, "
    "large messages are striped over the others");
const base::Setting port_setting("tcp", "ANVIEW_TCP_PORT", "0",
                                 "TCP port the data listener binds (0: any free port)");
const base::Setting sockbuf_setting(
    "tcp", "ANVIEW_TCP_SOCKBUF", "0",
    "SO_SNDBUF/SO_RCVBUF of data connections in bytes (0: kernel autotuning)");
const base::Setting paths_setting(
    "tcp", "ANVIEW_TCP_PATHS", "8",
    "Most network paths (pairs of local and remote interfaces on a shared subnet) used to one "
    "peer on another host (1: a single path)");
const base::Setting path_timeout_setting(
    "tcp", "ANVIEW_TCP_PATH_TIMEOUT", "500ms",
    "A path whose data stays unacknowledged this long fails over to the peer's other paths");
const base::Setting link_timeout_setting(
    "tcp", "ANVIEW_TCP_LINK_TIMEOUT", "10s",
    "When the last working path to a peer stays unacknowledged this long (every other path "
    "failed), the link to the peer fails");
const base::Setting credit_setting(
    "tcp", "ANVIEW_TCP_CREDIT", "2M",
    "Bytes a receiving rank lets its senders have on their way to it on data streams, shared "
    "among those sending at the moment (receiver-driven flow control against incast; 0: off)");
const base::Setting cc_setting(
    "tcp", "ANVIEW_TCP_CC", "",
    "Kernel congestion control of data connections (bbr, cubic, ...; empty: the system's "
    "default)");

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
  if (published.size() - static_cast<std::size_t>(loopback) > 1)
    p.notes.push_back(
        "several interfaces: a peer on another host reachable through more than "
        "one of them gets one path per interface pair (ANVIEW_TCP_PATHS)");
  if (!skipped.empty()) p.notes.push_back("IPv6 addresses not used (IPv4 only): " + join(skipped));
  return p;
}

namespace {

// Socket buffers below this make the receive window smaller than a segment where segments are
// large (loopback's MSS is 64 KiB; jumbo frames): every window update then waits for the
// kernel's persist timer. Measured here on loopback, 64 KiB ping-pong p50: 332 us with 16K,
// 28 us with 32K, 20-22 us with 64K or more; 1 MiB: 427 us with 32K, 236-262 us with 64K+.
constexpr int small_socket_buffer = 64 * 1024;

void warn_of_small_socket_buffers(int bytes) {
  static std::atomic<bool> told{false};
  if (bytes <= 0 || bytes >= small_socket_buffer || told.exchange(true)) return;
  base::log("tcp", base::LogLevel::warn, "tcp: ANVIEW_TCP_SOCKBUF=", sockbuf_setting.value(), " (",
            bytes,
            " bytes) is below 64 KiB: where a link's segments are larger than the "
            "receive window that leaves (loopback's are 64 KiB), each window update waits for "
            "the kernel's persist timer and messages of 64 KiB and more crawl (here 16x slower "
            "with 16K); unset, the kernel autotunes the buffers");
}

}  // namespace

TcpTransport::TcpTransport(const TransportContext& context)
    : context_(context),
      stream_count_(static_cast<int>(streams_setting.as_int())),
      sockbuf_bytes_(static_cast<int>(sockbuf_setting.as_int_in(0, 1 << 30))),
      max_paths_(static_cast<int>(paths_setting.as_int())),
      path_timeout_(path_timeout_setting.as_duration()),
      link_timeout_(link_timeout_setting.as_duration()),
      congestion_control_(cc_setting.value()),
      credit_bytes_(static_cast<std::uint64_t>(std::max<std::int64_t>(credit_setting.as_int(), 0))),
      max_frame_(base::limits::max_frame_bytes()),
      handshake_timeout_(base::limits::handshake_timeout()),
      max_pending_(base::limits::max_pending_connections()),
      secret_(base::auth::Secret::from_environment()),
      tls_(base::tls::Context::from_environment(secret_)) {
  warn_of_small_socket_buffers(sockbuf_bytes_);
  if (stream_count_ < 1 || stream_count_ > 64) {
    throw Error(ErrorKind::usage,
                {.rank = context_.rank,
                 .operation = "tcp.init",
                 .cause = "ANVIEW_TCP_STREAMS=" + streams_setting.value() + " is not in 1..64"});
  }
  if (max_paths_ < 1 || max_paths_ > 16) {
    throw Error(ErrorKind::usage,
                {.rank = context_.rank,
                 .operation = "tcp.init",
                 .cause = "ANVIEW_TCP_PATHS=" + paths_setting.value() + " is not in 1..16"});
  }
  const auto port = port_setting.as_int();
  const ErrorContext ctx = error_context(-1, "tcp.listen");
  listener_ = base::listen_tcp(
      base::SockAddr::from_host_port("0.0.0.0", static_cast<std::uint16_t>(port), ctx), 4096, ctx);
  port_ = base::local_address(listener_.get()).port();
  const auto interfaces = bootstrap::list_interfaces();
  for (const auto& address : publishable_addresses(nullptr)) {
    published_.push_back(address + ":" + std::to_string(port_));
    for (const auto& i : interfaces) {
      if (i.address == address && i.family == AF_INET) {
        local_addresses_.push_back({address, i.prefix_len});
        break;
      }
    }
  }
  const bool reachable = std::any_of(published_.begin(), published_.end(),
                                     [](const std::string& a) { return !is_loopback(a); });
  static std::atomic<bool> warned{false};
  static std::atomic<bool> told_tls{false};
  if (tls_ && !told_tls.exchange(true))
    base::log("tcp", base::LogLevel::info,
              "tcp: every connection is encrypted: ", tls_->describe());
  if (secret_.empty() && !tls_ && reachable && !warned.exchange(true)) {
    base::log("tcp", base::LogLevel::warn, "tcp: listening on port ", port_,
              " of every interface with no job secret: any process that reaches it can try to "
              "join the job. Set ANVIEW_SECRET on every rank (anview-run does it for each job); "
              "see SECURITY.md");
  }
  if (!congestion_control_.empty()) {
    // Fail early, on this rank, naming the setting, rather than on every socket later.
    base::Fd probe_fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (::setsockopt(probe_fd.get(), IPPROTO_TCP, TCP_CONGESTION, congestion_control_.data(),
                     static_cast<socklen_t>(congestion_control_.size())) != 0) {
      throw base::sys_error(ErrorKind::usage, error_context(-1, "tcp.init"),
                            "ANVIEW_TCP_CC=" + congestion_control_ +
                                ": the kernel refuses it (see "
                                "/proc/sys/net/ipv4/tcp_available_congestion_control)",
                            errno);
    }
  }
  peers_.resize(static_cast<std::size_t>(context_.world_size));
  context_.engine->add_fd(listener_.get(), EPOLLIN, this);
  context_.engine->add_poller([this] { return poll_housekeeping(); },
                              [this] {
                                if (housekeeping_.load(std::memory_order_acquire)) return true;
                                return multipath_.load(std::memory_order_relaxed) &&
                                       base::Clock::now().time_since_epoch().count() >=
                                           next_tick_ns_.load(std::memory_order_relaxed);
                              });
}

TcpTransport::~TcpTransport() {
  context_.engine->remove_fd(listener_.get());
  for (auto& link : peers_)
    for (auto& path : link.paths)
      for (auto& conn : path.streams)
        if (conn) conn->close(nullptr);
}

void TcpTransport::configure_socket(int fd) const {
  if (sockbuf_bytes_ > 0) base::set_buffer_sizes(fd, sockbuf_bytes_);
  if (!congestion_control_.empty())
    ::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, congestion_control_.data(),
                 static_cast<socklen_t>(congestion_control_.size()));
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

std::vector<PathPlan> TcpTransport::plan_for(const PeerInfo& peer) const {
  const bool same_host = !peer.host_id.empty() && peer.host_id == context_.host_id;
  return plan_paths(local_addresses_, peer.tcp_addresses, same_host, max_paths_);
}

bool TcpTransport::can_reach(const PeerInfo& peer, std::string* why) const {
  if (!plan_for(peer).empty()) return true;
  if (why) {
    *why = peer.tcp_addresses.empty()
               ? "rank " + std::to_string(peer.rank) + " published no TCP address"
               : "rank " + std::to_string(peer.rank) +
                     " is on another host and published only loopback addresses (check "
                     "ANVIEW_IFACES there)";
  }
  return false;
}

Handshake TcpTransport::make_hello(const PeerLink& link, int stream, int path,
                                   std::uint16_t generation) const {
  const auto path_count = static_cast<int>(link.paths.size());
  Handshake hello;
  hello.job_id = context_.job_id;
  hello.rank = static_cast<std::uint32_t>(context_.rank);
  hello.world_size = static_cast<std::uint32_t>(context_.world_size);
  hello.stream = static_cast<std::uint16_t>(stream);
  hello.stream_count = static_cast<std::uint16_t>(stream_count_);
  set_path_fields(hello, {.path = static_cast<std::uint8_t>(path),
                          .path_count = static_cast<std::uint8_t>(path_count),
                          .grants_credit = grants_credit(link),
                          .generation = generation});
  if (!secret_.empty()) {
    hello.auth = 1;
    hello.nonce = base::auth::fresh_nonce();
  }
  return hello;
}

void TcpTransport::connect(const std::vector<PeerInfo>& peers) {
  const base::Deadline deadline = base::deadline_after(context_.timeout);
  for (const auto& peer : peers) {
    PeerLink& link = peers_[static_cast<std::size_t>(peer.rank)];
    link.served = true;
    link.same_host = !peer.host_id.empty() && peer.host_id == context_.host_id;
    watch_process(peer);
    if (peer.rank <= context_.rank) continue;  // the lower rank connects
    link.connector = true;
    const auto plans = plan_for(peer);
    link.paths.resize(plans.size());
    for (std::size_t p = 0; p < plans.size(); ++p) {
      link.paths[p].plan = plans[p];
      link.paths[p].streams.resize(static_cast<std::size_t>(stream_count_));
    }
    link.reliable = plans.size() > 1;
    if (link.reliable) multipath_.store(true, std::memory_order_relaxed);
    link.address = plans.front().remote;
    if (link.reliable) {
      // Every path connects in the background and is tried again until one is up: start-up
      // does not depend on any one interface working.
      for (std::size_t p = 0; p < link.paths.size(); ++p)
        start_path(peer.rank, static_cast<int>(p));
      continue;
    }
    // One path: connected blocking, retrying until the peer listens.
    ErrorContext ctx = error_context(peer.rank, "connect");
    Path& first = link.paths.front();
    first.generation = 1;
    const auto addr = base::SockAddr::parse(first.plan.remote, ctx);
    std::optional<base::SockAddr> local;
    if (!first.plan.local_ip.empty())
      local = base::SockAddr::from_host_port(first.plan.local_ip, 0, ctx);
    for (int s = 0; s < stream_count_; ++s) {
      base::Fd fd = base::connect_tcp(addr, deadline, ctx, local ? &*local : nullptr);
      configure_socket(fd.get());
      const Handshake hello = make_hello(link, s, 0, first.generation);
      if (tls_) {
        // The TLS handshake, then the hello, go on in the progress engine: it sees the
        // connected socket writable at once.
        first.streams[static_cast<std::size_t>(s)] =
            std::make_unique<Connection>(*this, std::move(fd), Connection::State::connecting,
                                         peer.rank, s, 0, &hello, first.plan.remote);
      } else {
        base::write_all(fd.get(), &hello, sizeof hello, deadline, ctx);
        first.streams[static_cast<std::size_t>(s)] = std::make_unique<Connection>(
            *this, std::move(fd), Connection::State::awaiting_ack, peer.rank, s, 0, &hello);
      }
      first.streams[static_cast<std::size_t>(s)]->set_generation(first.generation);
    }
  }
  if (multipath_.load(std::memory_order_relaxed))
    set_next_tick(base::Clock::now() + multipath_tick);
}

void TcpTransport::watch_process(const PeerInfo& peer) {
  if (peer.pid <= 0 || peer.rank == context_.rank || peer.host_id != context_.host_id) return;
  std::string why;
  const int rank = peer.rank;
  auto watch = base::ProcessWatch::start(
      *context_.engine, peer.pid, [this, rank] { on_peer_process_exit(rank); }, &why);
  // Without a watch (neither a pidfd nor /proc) the end of the stream still tells, later.
  if (!watch) base::log("tcp", base::LogLevel::debug, "tcp: cannot watch rank ", rank, ": ", why);
  peers_[static_cast<std::size_t>(rank)].exit_watch = std::move(watch);
}

void TcpTransport::on_peer_process_exit(int peer) {
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  base::log("tcp", base::LogLevel::debug, "tcp: the process of rank ", peer, " ended");
  for (auto& path : link.paths)
    for (auto& conn : path.streams)
      if (conn && conn->state() == Connection::State::established) conn->drain();
}

bool TcpTransport::ready() const {
  for (const auto& link : peers_) {
    if (!link.served || link.failed) continue;
    if (!link.was_up) return false;
    // Every path came up or was tried once the peer listened: traffic starts on all of them.
    // (Only the connecting side can tell; the other takes paths as they come.)
    for (const auto& path : link.paths)
      if (link.connector && path.state != Path::State::up && !path.settled) return false;
  }
  return true;
}

std::optional<Error> TcpTransport::setup_failure() const {
  for (const auto& link : peers_)
    if (link.setup_error) return link.setup_error;
  return std::nullopt;
}

std::uint64_t TcpTransport::Path::bytes_sent() const {
  std::uint64_t total = retired_bytes;
  for (const auto& conn : streams)
    if (conn) total += conn->bytes_sent();
  return total;
}

std::string TcpTransport::Path::describe() const {
  if (!plan.local_ip.empty() || !plan.remote.empty()) return plan.describe();
  for (const auto& conn : streams)
    if (conn) return conn->describe();
  return "?";
}

void TcpTransport::count_established(int peer, int index) {
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  Path& path = link.paths[static_cast<std::size_t>(index)];
  if (++path.established < stream_count_) return;
  path.state = Path::State::up;
  path.outstanding_since.assign(static_cast<std::size_t>(stream_count_), base::Clock::time_point{});
  path.rate_at = base::Clock::now();
  path.rate_bytes = path.bytes_sent();
  const bool readmitted = path.ever_up;
  path.first_attempt = false;
  path.ever_up = true;
  path.settled = true;
  path.probe_backoff = std::chrono::milliseconds(0);
  if (readmitted) {
    base::log("tcp", base::LogLevel::info, "tcp: path ", index, " to rank ", peer, " (",
              path.describe(), ") is up again");
  }
  if (!link.was_up) {
    // The peer listens now: paths that failed before get their next try at once.
    for (auto& other : link.paths)
      if (other.state == Path::State::failed) other.next_probe = base::Clock::now();
  }
  link.was_up = true;
  if (link.control < 0 ||
      link.paths[static_cast<std::size_t>(link.control)].state != Path::State::up) {
    link.control = index;
  }
  grants_after_path_up(link);
  if (link.reliable) {
    // Copies of a failed path's frames may go on this one, and the peer may read them before
    // the news that went on the other paths: the news goes first here as well.
    tell_failed_paths(link, index);
    pump_ordered(peer);
    feed(peer);
    if (link.ack_due) send_ack(peer);
  }
}

std::string TcpTransport::pending_connections() const {
  std::string text;
  for (std::size_t r = 0; r < peers_.size(); ++r) {
    const PeerLink& link = peers_[r];
    if (!link.served || link.failed) continue;
    bool waiting = !link.was_up;
    for (const auto& path : link.paths)
      waiting = waiting || (link.connector && path.state != Path::State::up && !path.settled);
    if (!waiting) continue;
    if (!text.empty()) text += ", ";
    if (link.reliable) {
      text += "rank " + std::to_string(r) + " (" + describe_paths(link) + ")";
      continue;
    }
    int established = 0;
    for (const auto& path : link.paths) established += path.established;
    text += "rank " + std::to_string(r) + " (" + std::to_string(established) + "/" +
            std::to_string(stream_count_) + " streams, " +
            (static_cast<int>(r) > context_.rank ? "we connect" : "it connects") + ")";
  }
  return text;
}

void TcpTransport::on_fd_events(std::uint32_t) {
  accept_pending();
}

Landing TcpTransport::deliver_transport_frame(Connection& conn, const WireHeader& wire) {
  const FrameHeader& header = wire.frame;
  const int peer = conn.peer();
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  const bool known = header.type <= frame_credit;
  if (!known || header.payload_bytes != 0 || wire.seq != 0) {
    ErrorContext ctx = error_context(peer, "transfer");
    ctx.cause = "unknown transport frame type " + std::to_string(header.type);
    fail_link(peer, Error(ErrorKind::protocol, std::move(ctx)));
    return {};
  }
  switch (header.type) {
    case frame_abort: {
      // The peer lost another rank and gives up its link to us: name that rank.
      ErrorContext ctx = error_context(peer, "transfer");
      const bool named = header.arg < static_cast<std::uint64_t>(context_.world_size) &&
                         static_cast<int>(header.arg) != peer &&
                         static_cast<int>(header.arg) != context_.rank;
      if (named) ctx.peer = static_cast<int>(header.arg);
      ctx.cause = "rank " + std::to_string(peer) + " closed its link to this rank" +
                  (named ? " after it lost rank " + std::to_string(header.arg) : std::string());
      fail_link(peer, Error(ErrorKind::peer_lost, std::move(ctx)));
      return {};
    }
    case frame_goodbye:
      conn.mark_goodbye();
      return {};
    case frame_ack:
      if (link.reliable) on_acknowledged(peer, header.tag, header.id);
      return {};
    case frame_path_down: {
      if (!link.reliable || header.arg >= link.paths.size()) return {};
      const int index = static_cast<int>(header.arg);
      Path& path = link.paths[static_cast<std::size_t>(index)];
      const auto generation = static_cast<std::uint16_t>(header.tag);
      if (path.state != Path::State::failed && !newer(path.generation, generation)) {
        path_failed(peer, index, "rank " + std::to_string(peer) + " found it broken and closed it",
                    false);
      }
      return {};
    }
    case frame_credit: {
      const std::uint64_t index = header.tag;
      const auto stream = static_cast<std::size_t>(header.id & 0xFFFF);
      if (index >= link.paths.size() || stream >= link.paths[index].streams.size()) return {};
      // The grant may overtake our ack of that stream's handshake (it travels on another
      // stream): keep it all the same, or the stream would wait for a grant already spent.
      auto& target = link.paths[index].streams[stream];
      if (target && target->generation() == static_cast<std::uint16_t>(header.id >> 16))
        target->set_credit(header.arg);
      return {};
    }
    default:  // keepalive
      return {};
  }
}

Landing TcpTransport::deliver_frame(Connection& conn, const WireHeader& wire, bool may_defer) {
  const FrameHeader& header = wire.frame;
  if (header.type >= frame_goodbye) return deliver_transport_frame(conn, wire);
  if (closing_) return Landing{conn.discard_landing(header.payload_bytes), false};
  PeerLink& link = peers_[static_cast<std::size_t>(conn.peer())];
  if (link.reliable) return deliver_sequenced(conn, link, wire, may_defer);
  Landing landing = context_.sink->on_frame(conn.peer(), header, may_defer);
  if (!landing.defer && landing.data == nullptr && header.payload_bytes > 0)
    landing.data = conn.discard_landing(header.payload_bytes);  // the sink failed the frame
  return landing;
}

void TcpTransport::deliver_frame_done(Connection& conn, const WireHeader& wire, void* data) {
  const FrameHeader& header = wire.frame;
  if (header.type >= frame_goodbye || closing_) return;
  if (conn.duplicate()) return;  // counted, and given to the sink, when it first came
  // The sink refused the frame (its payload went to the discard buffer): it has arrived all the
  // same, and is acknowledged like any other, or the acknowledgements stop at it for good.
  const bool refused = conn.is_discard(data) && header.payload_bytes > 0;
  PeerLink& link = peers_[static_cast<std::size_t>(conn.peer())];
  if (link.reliable) {
    if (is_chunk_seq(wire.seq)) {
      link.chunks_done.insert(wire.seq & ~chunk_seq_bit);
      link.ack_due = true;  // the sender's request completes on this acknowledgement
    } else {
      link.ordered_done = wire.seq;
      link.unacked_bytes += header.payload_bytes;
      if (++link.unacked_frames >= ack_every_frames || link.unacked_bytes >= ack_every_bytes)
        link.ack_due = true;
    }
    if (!link.interrupted.empty()) link.interrupted.erase(wire.seq);
  }
  if (!refused) context_.sink->on_frame_done(conn.peer(), header, data);
}

void TcpTransport::on_connection_error(Connection& conn, const Error& error) {
  if (conn.peer() < 0 || conn.state() == Connection::State::awaiting_hello) {
    // Not one of our peers yet: garbage, a port scanner, a foreign program. Drop it.
    drops_.log("tcp", "tcp: dropped a connection from " + conn.remote() +
                          " before its handshake: " + error.cause());
    if (auto owned = take_accepting(conn)) drop_accepted(std::move(owned));
    return;
  }
  const int peer = conn.peer();
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  if (link.reliable && !link.failed) {
    Path& path = link.paths[static_cast<std::size_t>(conn.path())];
    if (path.state == Path::State::connecting) {
      path_attempt_failed(peer, conn.path(), error.cause());
      return;
    }
    if (path.state == Path::State::up && other_path_up(link, conn.path())) {
      path_failed(peer, conn.path(), error.cause(), true);
      return;
    }
  }
  fail_link(peer, error);
}

void TcpTransport::on_connection_eof(Connection& conn) {
  const int peer = conn.peer();
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  if (link.draining) return;  // an end of stream met while draining: the caller goes on
  if (!conn.goodbye_received()) {
    if (link.reliable && other_path_up(link, conn.path())) {
      path_failed(peer, conn.path(),
                  "connection closed by rank " + std::to_string(peer) + " without a goodbye", true);
      return;
    }
    // The process is gone. What it sent before it died is in our sockets: read every stream
    // to its end first, so complete messages are still delivered, then fail the link.
    link.draining = true;
    for (auto& path : link.paths)
      for (auto& other : path.streams)
        if (other && other.get() != &conn && other->state() == Connection::State::established)
          other->drain();
    link.draining = false;
    ErrorContext ctx = error_context(peer, "transfer");
    ctx.cause = "connection closed by rank " + std::to_string(peer) +
                " without a goodbye: the process exited or was killed";
    fail_link(peer, Error(ErrorKind::peer_lost, std::move(ctx)));
    return;
  }
  conn.half_close();  // the peer leaves: let it see our end of the stream too
  int live = 0;
  for (const auto& path : link.paths)
    if (path.state == Path::State::up) live += stream_count_;
  if (++link.eof_streams < live) return;
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
  for (auto& path : link.paths) {
    close_path_streams(path, error);
    path.state = Path::State::failed;
  }
  // Frames kept for sending again: their senders learn the link's fate.
  std::vector<SendDone> failed;
  for (auto& entry : link.ordered_unacked)
    if (entry.done) failed.push_back(std::move(entry.done));
  for (auto& entry : link.chunk_unacked)
    if (entry.done) failed.push_back(std::move(entry.done));
  link.ordered_unacked.clear();
  link.chunk_unacked.clear();
  link.chunk_queue.clear();
  link.interrupted.clear();
  for (auto& done : failed) done(&error);
  if (!closing_) context_.sink->on_peer_failed(peer, error, link.goodbye);
}

void TcpTransport::fail_peer(int peer, const Error& error) {
  // The layer above gives up the link (a failed operation, often because another rank was
  // lost): tell the peer why before closing, so it can name the rank that started it.
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  if (!link.failed && link.control >= 0) {
    auto& stream0 = link.paths[static_cast<std::size_t>(link.control)].streams[0];
    if (stream0) {
      WireHeader abort;
      abort.frame.type = frame_abort;
      const int cause = error.context().peer;
      abort.frame.arg =
          cause >= 0 && cause != peer ? static_cast<std::uint64_t>(cause) : ~std::uint64_t{0};
      stream0->try_send_now(abort);
    }
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
  for (auto& path : peers_[static_cast<std::size_t>(peer)].paths)
    for (auto& conn : path.streams)
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
      drop_pending(i, "no handshake within " + std::to_string(handshake_timeout_.count()) +
                          " ms (ANVIEW_HANDSHAKE_TIMEOUT)");
    }
  }
  if (listener_paused_until_ && base::Clock::now() >= *listener_paused_until_) {
    listener_paused_until_.reset();
    context_.engine->modify_fd(listener_.get(), EPOLLIN, this);
    accept_pending();
  }
  if (multipath_.load(std::memory_order_relaxed) &&
      base::Clock::now().time_since_epoch().count() >=
          next_tick_ns_.load(std::memory_order_relaxed)) {
    set_next_tick(base::Clock::now() + multipath_tick);
    periodic_check();
  }
  // Connections waiting for a hello need their deadline checked on later rounds too, and a
  // paused listener its resumption.
  housekeeping_.store(!accepting_.empty() || listener_paused_until_.has_value(),
                      std::memory_order_release);
  if (resume_wanted_.empty()) return false;
  std::vector<Connection*> wanted;
  wanted.swap(resume_wanted_);
  for (Connection* conn : wanted) {
    // A connection asked for may have failed meanwhile; only live ones are resumed.
    for (auto& link : peers_)
      for (auto& path : link.paths)
        for (auto& c : path.streams)
          if (c.get() == conn) conn->resume_reading();
  }
  return true;
}

Connection* TcpTransport::pick_stream(PeerLink& link, Ordering ordering) {
  if (link.control < 0) return nullptr;
  Path& path = link.paths[static_cast<std::size_t>(link.control)];
  if (path.state != Path::State::up) return nullptr;
  if (ordering == Ordering::ordered || stream_count_ == 1) return path.streams[0].get();
  // Bulk data keeps off stream 0 when there are others: matching frames there then never
  // wait behind megabytes of payload, and a receiver that stops reading stream 0 (its
  // unexpected-message budget is full) still receives the data of matched messages.
  Connection* best = path.streams[1].get();
  for (std::size_t s = 2; s < path.streams.size(); ++s)
    if (path.streams[s]->queued_bytes() < best->queued_bytes()) best = path.streams[s].get();
  return best;
}

void TcpTransport::post_send(int peer, const FrameHeader& header, const void* payload,
                             Ordering ordering, SendDone done) {
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  if (link.failed || !link.was_up || closing_) {
    ErrorContext ctx = error_context(peer, "send");
    ctx.cause = link.failed ? "the link to rank " + std::to_string(peer) + " is closed"
                            : "the link to rank " + std::to_string(peer) + " is not up";
    const Error error(ErrorKind::link, std::move(ctx));
    done(&error);
    return;
  }
  if (!link.reliable) {
    WireHeader wire{.seq = 0, .frame = header};
    Connection* conn = pick_stream(link, ordering);
    if (conn == nullptr) {
      ErrorContext ctx = error_context(peer, "send");
      ctx.cause = "the link to rank " + std::to_string(peer) + " has no working path";
      const Error error(ErrorKind::link, std::move(ctx));
      done(&error);
      return;
    }
    conn->queue_send(wire, payload, std::move(done));
    return;
  }
  Unacked entry;
  entry.header = header;
  entry.done = std::move(done);
  if (ordering == Ordering::ordered) {
    // Kept (copied: the caller may reuse its buffer once the frame is written) until the peer
    // acknowledges it.
    entry.seq = ++link.next_ordered;
    if (header.payload_bytes > 0) {
      entry.copy.reset(new char[header.payload_bytes]);
      std::memcpy(entry.copy.get(), payload, header.payload_bytes);
      entry.payload = entry.copy.get();
    }
    link.ordered_unacked.push_back(std::move(entry));
    pump_ordered(peer);
    return;
  }
  // A data chunk: the caller's buffer stays valid until `done`, called on acknowledgement.
  const std::uint64_t number = ++link.next_chunk;
  entry.seq = number | chunk_seq_bit;
  entry.payload = static_cast<const char*>(payload);
  link.chunk_unacked.push_back(std::move(entry));
  link.chunk_queue.push_back(number);
  feed(peer);
}

void TcpTransport::shutdown(base::Deadline deadline) {
  // Data chunks still waiting for a stream go first, and with several paths their
  // acknowledgements too (the peer needs them whole).
  auto sent = [this] {
    for (const auto& link : peers_)
      if (link.served && !link.failed && link.reliable &&
          (!link.chunk_queue.empty() || !link.chunk_unacked.empty()))
        return false;
    return true;
  };
  while (!sent() && base::Clock::now() < deadline) context_.engine->poll(10);
  closing_ = true;
  WireHeader goodbye;
  goodbye.frame.type = frame_goodbye;
  for (auto& link : peers_) {
    if (!link.served || link.failed) continue;
    for (auto& path : link.paths) {
      if (path.state != Path::State::up) continue;
      for (auto& conn : path.streams) {
        if (!conn || conn->state() != Connection::State::established) continue;
        conn->queue_send(goodbye, nullptr, nullptr);
        if (conn) conn->half_close();  // a failed write retires the whole link
      }
    }
  }
  // Drive the engine until every peer has seen our goodbye and closed its side too (closing
  // before that could turn unread data into a reset), or until the deadline.
  auto settled = [this] {
    for (const auto& link : peers_)
      for (const auto& path : link.paths)
        for (const auto& conn : path.streams)
          if (conn && conn->state() != Connection::State::closed && !conn->eof()) return false;
    return true;
  };
  while (!settled() && base::Clock::now() < deadline) context_.engine->poll(10);
  for (auto& link : peers_)
    for (auto& path : link.paths)
      for (auto& conn : path.streams)
        if (conn) conn->close(nullptr);
}

void TcpTransport::collect_metrics(base::metrics::Sink& sink,
                                   const base::metrics::Labels& labels) const {
  for (std::size_t r = 0; r < peers_.size(); ++r) {
    const PeerLink& link = peers_[r];
    for (std::size_t p = 0; p < link.paths.size(); ++p) {
      const Path& path = link.paths[p];
      base::metrics::Labels pl = labels;
      pl.emplace_back("peer", std::to_string(r));
      pl.emplace_back("path_index", std::to_string(p));
      pl.emplace_back("path", path.describe());
      sink.gauge("anview_tcp_path_up", "1 while a network path to a peer carries traffic", pl,
                 path.state == Path::State::up ? 1 : 0);
      sink.counter("anview_tcp_path_failures_total",
                   "Times a network path failed (reset, closed, or unacknowledged too long)", pl,
                   static_cast<double>(path.failures));
      sink.counter("anview_tcp_path_resent_frames_total",
                   "Frames sent again on other paths after this path failed", pl,
                   static_cast<double>(path.resent_frames));
      sink.counter("anview_tcp_path_sent_bytes_total",
                   "Bytes a path's connections sent (all its connections so far)", pl,
                   static_cast<double>(path.bytes_sent()));
      sink.gauge("anview_tcp_path_rtt_seconds", "Smoothed round-trip time of a path (kernel)", pl,
                 path.rtt_us * 1e-6);
      sink.gauge("anview_tcp_path_send_rate_bytes",
                 "Bytes per second a path sent lately (smoothed)", pl, path.rate);
      sink.gauge("anview_tcp_path_capacity_bytes",
                 "Bytes per second a path can deliver (the kernel's delivery rate while busy)", pl,
                 path.capacity);
      for (const auto& conn : path.streams) {
        if (!conn) continue;
        base::metrics::Labels l = labels;
        l.emplace_back("peer", std::to_string(r));
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
}

std::string TcpTransport::describe_peer(int peer) const {
  const PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  const std::string streams =
      std::to_string(stream_count_) + " stream" + (stream_count_ > 1 ? "s" : "");
  // What each stream holds: for hang reports, where the flow stands.
  std::string flow;
  for (std::size_t p = 0; p < link.paths.size(); ++p)
    for (const auto& conn : link.paths[p].streams)
      if (conn && conn->state() == Connection::State::established &&
          (conn->queued_bytes() > 0 || conn->credited()))
        flow += "; path " + std::to_string(p) + " stream " + std::to_string(conn->stream()) + ": " +
                conn->flow_state();
  if (link.reliable) {
    flow += "; unacknowledged: " + std::to_string(link.ordered_unacked.size()) + " ordered, " +
            std::to_string(link.chunk_unacked.size()) + " chunks (" +
            std::to_string(link.chunk_queue.size()) +
            " waiting for a stream); received whole: " + "ordered " +
            std::to_string(link.ordered_done) + ", chunks " +
            std::to_string(link.chunks_done.floor()) + " (+" +
            std::to_string(link.chunks_done.above_floor()) + " beyond)";
  }
  if (link.paths.size() > 1) {
    return "tcp, " + std::to_string(link.paths.size()) + " paths of " + streams + ": " +
           describe_paths(link) + (link.failed ? " (closed)" : "") + flow;
  }
  std::string text =
      "tcp " + (link.address.empty() ? std::string("?") : link.address) + ", " + streams;
  if (link.failed) text += " (closed)";
  return text + flow;
}

}  // namespace anview::transport::tcp
