#include "transport/tcp/handshake.hpp"

#include <algorithm>

#include "base/tls.hpp"

namespace anview::transport::tcp {

const char* to_string(RejectReason reason) {
  switch (reason) {
    case RejectReason::none:
      return "none";
    case RejectReason::version:
      return "protocol version mismatch";
    case RejectReason::job:
      return "job id mismatch (a process of another job)";
    case RejectReason::rank:
      return "unexpected rank";
    case RejectReason::world_size:
      return "world size mismatch";
    case RejectReason::streams:
      return "stream count mismatch (ANVIEW_TCP_STREAMS differs)";
    case RejectReason::duplicate:
      return "duplicate connection";
    case RejectReason::closing:
      return "peer is shutting down";
    case RejectReason::auth:
      return "job secret mismatch (ANVIEW_SECRET is set on one side only)";
    case RejectReason::tls:
      return "it requires TLS (ANVIEW_TLS=1 there, not here: set it on every rank, or on none)";
  }
  return "unknown reason";
}

PathFields path_fields(const Handshake& h) {
  const auto raw = static_cast<std::uint32_t>(h.reason);
  PathFields f;
  f.path = static_cast<std::uint8_t>(raw & 0xFF);
  f.path_count = static_cast<std::uint8_t>(std::max<std::uint32_t>((raw >> 8) & 0x7F, 1));
  f.grants_credit = (raw & 0x8000) != 0;
  f.generation = static_cast<std::uint16_t>(raw >> 16);
  return f;
}

void set_path_fields(Handshake& h, const PathFields& f) {
  h.reason = static_cast<RejectReason>(
      std::uint32_t{f.path} | (std::uint32_t{f.path_count} & 0x7F) << 8 |
      (f.grants_credit ? 0x8000u : 0u) | std::uint32_t{f.generation} << 16);
}

namespace {

base::auth::Mac proof(const base::auth::Secret& secret, const char* role, const Handshake& hello,
                      const Handshake& ack) {
  base::auth::MacInput in;
  in.text(role)
      .u64(hello.job_id)
      .u64(hello.rank)
      .u64(ack.rank)
      .u64(hello.world_size)
      .u64(hello.stream)
      .u64(hello.stream_count)
      .u64(static_cast<std::uint32_t>(hello.reason))
      .u64(static_cast<std::uint32_t>(ack.reason))
      .bytes(hello.nonce)
      .bytes(ack.nonce);
  return secret.mac(in);
}

}  // namespace

base::auth::Mac accept_proof(const base::auth::Secret& secret, const Handshake& hello,
                             const Handshake& ack) {
  return proof(secret, "anview tcp accept", hello, ack);
}

base::auth::Mac connect_proof(const base::auth::Secret& secret, const Handshake& hello,
                              const Handshake& ack) {
  return proof(secret, "anview tcp connect", hello, ack);
}

RejectReason check_hello(const Handshake& hello, const HandshakeExpectation& expected,
                         bool* foreign, std::string* why) {
  *foreign = hello.magic != handshake_magic;
  if (*foreign) {
    *why = base::tls::looks_like_tls(&hello, handshake_prefix_bytes)
               ? "the peer speaks TLS (ANVIEW_TLS=1 there, not here: set it on every rank, or "
                 "on none)"
               : "not an Anview peer (bad magic)";
    return RejectReason::version;
  }
  if (hello.version != protocol_version) {
    *why = "peer speaks protocol version " + std::to_string(hello.version) +
           ", this process speaks " + std::to_string(protocol_version);
    return RejectReason::version;
  }
  if (hello.kind != HandshakeKind::hello) {
    *why =
        "expected a hello, got handshake kind " + std::to_string(static_cast<unsigned>(hello.kind));
    *foreign = true;
    return RejectReason::version;
  }
  if (hello.job_id != expected.job_id) {
    *why = "job id " + std::to_string(hello.job_id) + " is not ours (" +
           std::to_string(expected.job_id) + ")";
    return RejectReason::job;
  }
  if (hello.world_size != expected.world_size) {
    *why = "world size " + std::to_string(hello.world_size) + " differs from ours (" +
           std::to_string(expected.world_size) + ")";
    return RejectReason::world_size;
  }
  // Lower ranks connect to higher ones, so a hello must come from a rank below ours.
  if (hello.rank >= expected.my_rank) {
    *why = "rank " + std::to_string(hello.rank) + " does not connect to rank " +
           std::to_string(expected.my_rank);
    return RejectReason::rank;
  }
  const PathFields path = path_fields(hello);
  if (path.path >= path.path_count) {
    *why = "path " + std::to_string(path.path) + " of " + std::to_string(path.path_count) +
           " does not exist";
    return RejectReason::streams;
  }
  if (hello.stream_count != expected.stream_count || hello.stream >= hello.stream_count) {
    *why = "stream " + std::to_string(hello.stream) + " of " + std::to_string(hello.stream_count) +
           " does not fit this rank's " + std::to_string(expected.stream_count) + " streams";
    return RejectReason::streams;
  }
  if ((hello.auth != 0) != expected.has_secret) {
    *why = expected.has_secret
               ? "rank " + std::to_string(hello.rank) +
                     " connected without the job secret (ANVIEW_SECRET is not set there)"
               : "rank " + std::to_string(hello.rank) +
                     " has a job secret and this rank has none (set the same ANVIEW_SECRET on "
                     "every rank)";
    return RejectReason::auth;
  }
  return RejectReason::none;
}

std::string explain_reject(const Handshake& reply, int peer) {
  std::string text =
      "rank " + std::to_string(peer) + " rejected the connection: " + to_string(reply.reason);
  if (reply.reason == RejectReason::version)
    text += " (peer speaks version " + std::to_string(reply.version) + ", this process speaks " +
            std::to_string(protocol_version) + ")";
  return text;
}

}  // namespace anview::transport::tcp
