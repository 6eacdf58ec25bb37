#include "transport/tcp/handshake.hpp"

namespace anview::transport::tcp {

const char* to_string(RejectReason reason) {
  switch (reason) {
    case RejectReason::none: return "none";
    case RejectReason::version: return "protocol version mismatch";
    case RejectReason::job: return "job id mismatch (a process of another job)";
    case RejectReason::rank: return "unexpected rank";
    case RejectReason::world_size: return "world size mismatch";
    case RejectReason::streams: return "stream count mismatch (ANVIEW_TCP_STREAMS differs)";
    case RejectReason::duplicate: return "duplicate connection";
    case RejectReason::closing: return "peer is shutting down";
  }
  return "unknown reason";
}

RejectReason check_hello(const Handshake& hello, const HandshakeExpectation& expected,
                         bool* foreign, std::string* why) {
  *foreign = hello.magic != handshake_magic;
  if (*foreign) {
    *why = "not an Anview peer (bad magic)";
    return RejectReason::version;
  }
  if (hello.version != protocol_version) {
    *why = "peer speaks protocol version " + std::to_string(hello.version) +
           ", this process speaks " + std::to_string(protocol_version);
    return RejectReason::version;
  }
  if (hello.kind != HandshakeKind::hello) {
    *why = "expected a hello, got handshake kind " +
           std::to_string(static_cast<unsigned>(hello.kind));
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
  if (hello.stream_count != expected.stream_count || hello.stream >= hello.stream_count) {
    *why = "stream " + std::to_string(hello.stream) + " of " + std::to_string(hello.stream_count) +
           " does not fit this rank's " + std::to_string(expected.stream_count) + " streams";
    return RejectReason::streams;
  }
  return RejectReason::none;
}

std::string explain_reject(const Handshake& reply, int peer) {
  std::string text = "rank " + std::to_string(peer) + " rejected the connection: " +
                     to_string(reply.reason);
  if (reply.reason == RejectReason::version)
    text += " (peer speaks version " + std::to_string(reply.version) + ", this process speaks " +
            std::to_string(protocol_version) + ")";
  return text;
}

}  // namespace anview::transport::tcp
