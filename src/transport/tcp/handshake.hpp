// The TCP connection handshake (docs/wire-protocol.md, "Handshake"): the connecting side sends
// a hello, the accepting side answers with an ack or a reject that says why, then closes.
// magic and version sit at the same offsets in every version, so any two versions can tell
// each other apart.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "base/auth.hpp"

namespace anview::transport::tcp {

inline constexpr std::uint32_t handshake_magic = 0x57564E41;  // "ANVW" in little endian
// 2: frames carry an 8-byte sequence number (multi-path failover), hellos name their path.
// 3: handshakes carry nonces and proofs of the job secret (88 bytes, "Authentication").
inline constexpr std::uint16_t protocol_version = 3;

// Without a job secret: hello, then ack or reject. With one: hello (connecting side, its
// nonce), ack (accepting side: its nonce and proof), proof (connecting side), then admitted or
// reject. The accepting side changes no state and says nothing of it (taken streams and the
// like) before the proof checks; a wrong proof is not answered.
enum class HandshakeKind : std::uint16_t {
  hello = 1,
  ack = 2,
  reject = 3,
  proof = 4,
  admitted = 5
};

enum class RejectReason : std::uint32_t {
  none = 0,
  version = 1,     // different protocol version
  job = 2,         // different job id: a process of another job
  rank = 3,        // rank out of range, or a rank that does not connect to us
  world_size = 4,  // different world size
  streams = 5,     // different ANVIEW_TCP_STREAMS
  duplicate = 6,   // this (rank, stream) is already connected
  closing = 7,     // this rank is shutting down
  auth = 8,        // one side has a job secret and the other has none
  tls = 9,         // this side uses TLS (ANVIEW_TLS=1) and the other does not; sent in plain
};

struct Handshake {
  std::uint32_t magic = handshake_magic;
  std::uint16_t version = protocol_version;
  HandshakeKind kind = HandshakeKind::hello;
  std::uint64_t job_id = 0;
  std::uint32_t rank = 0;  // the sender's rank
  std::uint32_t world_size = 0;
  std::uint16_t stream = 0;        // index of this connection among its path's streams
  std::uint16_t stream_count = 0;  // streams per path
  // A reject's reason; in a hello or an ack the same four bytes hold the PathFields.
  RejectReason reason = RejectReason::none;
  // Version 3 from here on; the 32 bytes above are the same in every version.
  std::uint32_t auth = 0;  // hello, ack: 1 when the sender has a job secret
  std::uint32_t reserved = 0;
  base::auth::Nonce nonce{};  // hello, ack with a secret: fresh random bytes
  base::auth::Mac mac{};      // ack: the accepting side's proof; proof: the connecting side's
};
static_assert(sizeof(Handshake) == 88, "Handshake is a wire format");
// What every version's handshake starts with (magic and version included): a reader takes
// these first and the rest only when the version is ours.
inline constexpr std::size_t handshake_prefix_bytes = 32;

// The proofs of a connection whose hello and ack carried nonces: HMAC-SHA256 over a role
// label, both nonces, the job id, both ranks, the world size, the stream and both path fields.
// The accepting side puts accept_proof in its ack; the connecting side answers with
// connect_proof. A recorded handshake is no use later: the other side's nonce is new.
base::auth::Mac accept_proof(const base::auth::Secret& secret, const Handshake& hello,
                             const Handshake& ack);
base::auth::Mac connect_proof(const base::auth::Secret& secret, const Handshake& hello,
                              const Handshake& ack);

// Which network path a hello's connection belongs to (offset 28 of a hello or an ack).
struct PathFields {
  std::uint8_t path = 0;         // index among the pair's paths (pairs of interfaces)
  std::uint8_t path_count = 1;   // paths the connecting side plans (0 reads as 1), below 128
  bool grants_credit = false;    // the sender limits its peers' data streams with credits
                                 // (the top bit of the path_count byte)
  std::uint16_t generation = 0;  // bumped each time the path is connected again
};
PathFields path_fields(const Handshake& h);
void set_path_fields(Handshake& h, const PathFields& fields);

const char* to_string(RejectReason reason);

// What we expect of a hello from a peer of this job.
struct HandshakeExpectation {
  std::uint64_t job_id;
  std::uint32_t world_size;
  std::uint32_t my_rank;
  std::uint16_t stream_count;
  bool has_secret;  // hellos must say they have one too (and then prove it)
};

// Validates a hello received on the listening port. Returns the reason to reject it, or none,
// and puts a human-readable explanation in `why`. A wrong magic is not answered at all (it is
// not one of ours): `foreign` is set and the caller just drops the connection.
RejectReason check_hello(const Handshake& hello, const HandshakeExpectation& expected,
                         bool* foreign, std::string* why);

// Explains a reject received in answer to our hello, for the Error raised to the user.
std::string explain_reject(const Handshake& reply, int peer);

}  // namespace anview::transport::tcp
