// Who gets in: accepting connections, checking hellos and (in a job with a secret) the proofs
// of both sides, and taking an accepted stream into its peer's path. docs/wire-protocol.md,
// "Handshake" and "Authentication".
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <optional>

#include "base/log.hpp"
#include "transport/tcp/multipath.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace anview::transport::tcp {
namespace {

// How long the listener rests after accept() ran out of descriptors or memory.
constexpr auto listener_pause = std::chrono::milliseconds(100);

}  // namespace

void TcpTransport::accept_pending() {
  while (!listener_paused_until_) {
    const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == EINTR || err == ECONNABORTED) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      if ((err == EMFILE || err == ENFILE) && !accepting_.empty()) {
        // Out of descriptors: the pending connections hold them, so the oldest gives way.
        drop_pending(0, "out of file descriptors (" + base::errno_text(err) +
                            "); the oldest connection waiting for its handshake gives way");
        continue;
      }
      // Out of descriptors or memory with nothing to shed: the listener stays readable, so
      // accepting again now would only spin. Leave it alone for a moment; the backlog keeps
      // what arrives.
      drops_.log("tcp", "tcp: cannot accept a connection (" + base::errno_text(err) +
                            "); accepting again in " + std::to_string(listener_pause.count()) +
                            " ms");
      listener_paused_until_ = base::Clock::now() + listener_pause;
      context_.engine->modify_fd(listener_.get(), 0, this);
      housekeeping_.store(true, std::memory_order_release);
      return;
    }
    configure_socket(fd);
    housekeeping_.store(true, std::memory_order_release);
    accepting_.push_back(std::make_unique<Connection>(*this, base::Fd(fd),
                                                      Connection::State::awaiting_hello, -1, -1));
    accepting_deadlines_.push_back(base::deadline_after(handshake_timeout_));
    // Against a flood or idle connections (slow-loris): the oldest gives way. A peer of the
    // job finishes its handshake within a round trip; the oldest is the likeliest idler. It
    // gets one read first: a peer whose hello arrived with a flood accepted in the same round
    // goes on (it leaves accepting_ when admitted), an idler or a slow-loris gives way.
    while (accepting_.size() > max_pending_) {
      Connection* oldest = accepting_.front().get();
      oldest->on_fd_events(EPOLLIN);
      if (accepting_.size() > max_pending_ && accepting_.front().get() == oldest)
        drop_pending(0, std::to_string(max_pending_) +
                            " connections are waiting for their handshake "
                            "(ANVIEW_MAX_PENDING_CONNECTIONS); the oldest gives way");
    }
  }
}

void TcpTransport::drop_pending(std::size_t index, const std::string& why) {
  drops_.log("tcp", "tcp: dropped a connection from " + accepting_[index]->remote() + ": " + why);
  drop_accepted(take_accepting_at(index));
}

std::unique_ptr<Connection> TcpTransport::take_accepting(Connection& conn) {
  auto it = std::find_if(accepting_.begin(), accepting_.end(),
                         [&](const auto& c) { return c.get() == &conn; });
  if (it == accepting_.end()) return nullptr;
  return take_accepting_at(static_cast<std::size_t>(it - accepting_.begin()));
}

std::unique_ptr<Connection> TcpTransport::take_accepting_at(std::size_t index) {
  const auto at = static_cast<std::ptrdiff_t>(index);
  std::unique_ptr<Connection> owned = std::move(accepting_[index]);
  accepting_.erase(accepting_.begin() + at);
  accepting_deadlines_.erase(accepting_deadlines_.begin() + at);
  return owned;
}

void TcpTransport::drop_accepted(std::unique_ptr<Connection> conn) {
  conn->close(nullptr);
  retire(std::move(conn));
}

RejectReason TcpTransport::admission(const Handshake& hello, bool* foreign,
                                     std::string* why) const {
  RejectReason reason =
      check_hello(hello,
                  {context_.job_id, static_cast<std::uint32_t>(context_.world_size),
                   static_cast<std::uint32_t>(context_.rank),
                   static_cast<std::uint16_t>(stream_count_), !secret_.empty()},
                  foreign, why);
  if (reason != RejectReason::none) return reason;
  const PeerLink& link = peers_[hello.rank];
  const PathFields fields = path_fields(hello);
  if (closing_) {
    *why = "this rank is shutting down";
    return RejectReason::closing;
  }
  if (!link.served || link.failed) {
    *why = "rank " + std::to_string(hello.rank) + " is not served here or its link is closed";
    return RejectReason::duplicate;
  }
  // The first hello of a peer sets its path count (admit()).
  if (link.paths.empty()) return RejectReason::none;
  if (link.paths.size() != fields.path_count) {
    *why = "path count " + std::to_string(fields.path_count) + " differs from the " +
           std::to_string(link.paths.size()) + " paths rank " + std::to_string(hello.rank) +
           " announced before";
    return RejectReason::streams;
  }
  const Path& path = link.paths[fields.path];
  if (path.state == Path::State::failed && !replaces_path(link, fields)) {
    // A stream of the path as it was (its sibling's failure came first): only a newer
    // generation brings the path back.
    *why = "path " + std::to_string(fields.path) + " of rank " + std::to_string(hello.rank) +
           " failed in generation " + std::to_string(path.generation) +
           "; a stream of it must come with a newer one";
    return RejectReason::duplicate;
  }
  const bool taken = path.streams[hello.stream] != nullptr;
  if (!replaces_path(link, fields) &&
      (taken || (path.generation != 0 && fields.generation != path.generation))) {
    *why = "stream " + std::to_string(hello.stream) + " of path " + std::to_string(fields.path) +
           " of rank " + std::to_string(hello.rank) + " is already connected (generation " +
           std::to_string(path.generation) + ")";
    return RejectReason::duplicate;
  }
  return RejectReason::none;
}

bool TcpTransport::replaces_path(const PeerLink& link, const PathFields& fields) const {
  if (link.paths.empty()) return false;
  const Path& path = link.paths[fields.path];
  return link.reliable && path.generation != 0 && newer(fields.generation, path.generation);
}

Handshake TcpTransport::plaintext_reject() const {
  Handshake reject = reply_to(Handshake{}, HandshakeKind::reject);
  reject.reason = RejectReason::tls;
  return reject;
}

Handshake TcpTransport::reply_to(const Handshake& hello, HandshakeKind kind) const {
  Handshake reply;
  reply.kind = kind;
  reply.job_id = context_.job_id;
  reply.rank = static_cast<std::uint32_t>(context_.rank);
  reply.world_size = static_cast<std::uint32_t>(context_.world_size);
  reply.stream = hello.stream;
  reply.stream_count = hello.stream_count;
  return reply;
}

void TcpTransport::reject_accepted(Connection& conn, const Handshake& hello, RejectReason reason,
                                   const std::string& why, bool foreign) {
  if (reason == RejectReason::auth) {
    log_auth_failure(conn.remote(), why);
  } else {
    drops_.log("tcp", "tcp: dropped a connection from " + conn.remote() + ": " + why);
  }
  if (!foreign) {
    Handshake reject = reply_to(hello, HandshakeKind::reject);
    reject.reason = reason;
    conn.send_handshake(reject);
  }
  if (auto owned = take_accepting(conn)) drop_accepted(std::move(owned));
}

void TcpTransport::on_hello(Connection& conn, const Handshake& hello) {
  bool foreign = false;
  std::string why;
  // With a secret, only what the hello says of itself is checked before the proof: the state
  // of our links is nobody's business before that.
  const RejectReason reason =
      secret_.empty()
          ? admission(hello, &foreign, &why)
          : check_hello(hello,
                        {context_.job_id, static_cast<std::uint32_t>(context_.world_size),
                         static_cast<std::uint32_t>(context_.rank),
                         static_cast<std::uint16_t>(stream_count_), true},
                        &foreign, &why);
  if (reason != RejectReason::none) {
    reject_accepted(conn, hello, reason, why, foreign);
    return;
  }
  Handshake ack = reply_to(hello, HandshakeKind::ack);
  PathFields echoed = path_fields(hello);
  echoed.grants_credit = grants_credit(peers_[hello.rank]);
  set_path_fields(ack, echoed);
  if (!secret_.empty()) {
    // Our challenge, with our proof.
    ack.auth = 1;
    ack.nonce = base::auth::fresh_nonce();
    ack.mac = accept_proof(secret_, hello, ack);
  }
  if (!conn.send_handshake(ack)) {
    drops_.log("tcp", "tcp: could not answer the hello of rank " + std::to_string(hello.rank) +
                          " from " + conn.remote() + ": " + base::errno_text(errno));
    if (auto owned = take_accepting(conn)) drop_accepted(std::move(owned));
    return;
  }
  if (!secret_.empty()) {
    conn.await_proof(hello, ack);  // stays in accepting_, under its handshake deadline
    return;
  }
  if (auto owned = take_accepting(conn)) admit(std::move(owned), hello);
}

void TcpTransport::on_proof(Connection& conn, const Handshake& proof) {
  const Handshake hello = conn.hello();
  const bool proven = proof.magic == handshake_magic && proof.version == protocol_version &&
                      proof.kind == HandshakeKind::proof &&
                      base::auth::same(proof.mac, connect_proof(secret_, hello, conn.ack()));
  if (!proven) {
    // Not answered: who does not know the secret learns nothing here.
    log_auth_failure(conn.remote(),
                     "no valid proof of the job secret in answer to our "
                     "challenge (a different ANVIEW_SECRET, or a replayed "
                     "handshake)");
    if (auto owned = take_accepting(conn)) drop_accepted(std::move(owned));
    return;
  }
  bool foreign = false;
  std::string why;
  const RejectReason reason = admission(hello, &foreign, &why);
  if (reason != RejectReason::none) {
    reject_accepted(conn, hello, reason, why, foreign);
    return;
  }
  Handshake admitted = conn.ack();
  admitted.kind = HandshakeKind::admitted;
  admitted.mac = {};
  if (!conn.send_handshake(admitted)) {
    base::log("tcp", base::LogLevel::warn, "tcp: could not admit rank ", hello.rank, " from ",
              conn.remote(), ": ", base::errno_text(errno));
    if (auto owned = take_accepting(conn)) drop_accepted(std::move(owned));
    return;
  }
  if (auto owned = take_accepting(conn)) admit(std::move(owned), hello);
}

void TcpTransport::admit(std::unique_ptr<Connection> owned, const Handshake& hello) {
  const int peer = static_cast<int>(hello.rank);
  PeerLink* link = &peers_[hello.rank];
  const PathFields fields = path_fields(hello);
  if (link->paths.empty()) {
    link->paths.resize(fields.path_count);
    for (auto& path : link->paths) path.streams.resize(static_cast<std::size_t>(stream_count_));
    link->reliable = fields.path_count > 1;
    if (link->reliable) {
      multipath_.store(true, std::memory_order_relaxed);
      set_next_tick(base::Clock::now() + multipath_tick);
    }
  }
  if (replaces_path(*link, fields)) {
    Path& path = link->paths[fields.path];
    if (path.state != Path::State::failed) {
      path_failed(peer, fields.path, "rank " + std::to_string(peer) + " connected it again", false);
    }
    path.streams.resize(static_cast<std::size_t>(stream_count_));  // all empty: failed paths
                                                                   // admit no stream
    path.established = 0;
    path.state = Path::State::connecting;
  }
  const std::string from = owned->remote();
  if (fields.path == 0 || link->address.empty()) link->address = from;
  Path& path = link->paths[fields.path];
  path.generation = fields.generation;
  if (path.plan.remote.empty()) {
    // Named from this side: our address on it and the peer's.
    path.plan = PathPlan{base::local_address(owned->fd()).host(), from};
  }
  owned->set_established(peer, hello.stream);
  owned->set_generation(fields.generation);
  // The connection's path is known only now.
  path.streams[hello.stream] = std::move(owned);
  path.streams[hello.stream]->set_path(fields.path);
  link->peer_grants = fields.grants_credit;
  start_credit(*link, *path.streams[hello.stream]);
  count_established(peer, fields.path);
}

namespace {

// Why the connecting side gives a handshake up (TcpTransport::refuse).
struct Refusal {
  ErrorKind kind;
  std::string cause;
};

}  // namespace

void TcpTransport::on_ack(Connection& conn, const Handshake& reply) {
  const int peer = conn.peer();
  std::optional<Refusal> refused;
  if (reply.magic != handshake_magic ||
      (reply.kind != HandshakeKind::ack && reply.kind != HandshakeKind::reject)) {
    refused = Refusal{ErrorKind::protocol,
                      "rank " + std::to_string(peer) +
                          " answered the handshake with bytes that are not an Anview handshake"};
  } else if (reply.kind == HandshakeKind::reject) {
    refused = Refusal{reply.reason == RejectReason::auth ? ErrorKind::auth : ErrorKind::protocol,
                      explain_reject(reply, peer)};
  } else if (reply.version != protocol_version || reply.job_id != context_.job_id ||
             reply.rank != static_cast<std::uint32_t>(peer) || reply.stream != conn.stream()) {
    refused =
        Refusal{ErrorKind::protocol,
                "rank " + std::to_string(peer) + " acknowledged with mismatching fields (version " +
                    std::to_string(reply.version) + ", rank " + std::to_string(reply.rank) + ")"};
  } else if (secret_.empty() && reply.auth != 0) {
    refused = Refusal{ErrorKind::auth, "rank " + std::to_string(peer) +
                                           " has a job secret and this rank has none (set the "
                                           "same ANVIEW_SECRET on every rank)"};
  } else if (!secret_.empty() &&
             (reply.auth == 0 ||
              !base::auth::same(reply.mac, accept_proof(secret_, conn.hello(), reply)))) {
    refused = Refusal{ErrorKind::auth,
                      "rank " + std::to_string(peer) + " at " + conn.remote() +
                          " did not prove the job secret (a different ANVIEW_SECRET there?)"};
    log_auth_failure(conn.remote(), refused->cause);
  }
  if (!refused && !secret_.empty()) {
    Handshake proof = reply;
    proof.kind = HandshakeKind::proof;
    proof.rank = static_cast<std::uint32_t>(context_.rank);
    proof.mac = connect_proof(secret_, conn.hello(), reply);
    if (conn.send_handshake(proof)) {
      conn.await_admission(reply);
      return;
    }
    refused = Refusal{ErrorKind::link, "could not send the proof to rank " + std::to_string(peer) +
                                           ": " + base::errno_text(errno)};
  }
  if (refused) {
    refuse(conn, refused->kind, std::move(refused->cause));
    return;
  }
  established(conn, reply);
}

void TcpTransport::on_admission(Connection& conn, const Handshake& reply) {
  const int peer = conn.peer();
  if (reply.magic == handshake_magic && reply.version == protocol_version &&
      reply.kind == HandshakeKind::admitted && reply.rank == static_cast<std::uint32_t>(peer) &&
      reply.stream == conn.stream() && base::auth::same(reply.nonce, conn.ack().nonce)) {
    established(conn, conn.ack());
    return;
  }
  if (reply.magic == handshake_magic && reply.kind == HandshakeKind::reject) {
    refuse(conn, reply.reason == RejectReason::auth ? ErrorKind::auth : ErrorKind::protocol,
           explain_reject(reply, peer));
    return;
  }
  refuse(
      conn, ErrorKind::protocol,
      "rank " + std::to_string(peer) + " answered our proof with bytes that are not an admission");
}

void TcpTransport::refuse(Connection& conn, ErrorKind kind, std::string cause) {
  const int peer = conn.peer();
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  if (link.reliable && link.was_up) {
    path_attempt_failed(peer, conn.path(), cause);
    return;
  }
  ErrorContext ctx = error_context(peer, "connect");
  ctx.cause = std::move(cause);
  fail_link(peer, Error(kind, std::move(ctx)));
}

void TcpTransport::established(Connection& conn, const Handshake& reply) {
  const int peer = conn.peer();
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  conn.set_established(peer, conn.stream());
  link.peer_grants = path_fields(reply).grants_credit;
  start_credit(link, conn);
  count_established(peer, conn.path());
}

void TcpTransport::log_auth_failure(const std::string& remote, const std::string& why) {
  std::string host;
  if (!auth_failures_.first(remote, &host)) return;
  base::log("tcp", base::LogLevel::warn, "tcp: authentication failed with ", remote, ": ", why,
            " (further failures with ", host, " are not logged)");
}

}  // namespace anview::transport::tcp
