// The TCP store's wire format, shared by the server, the client and the tests.
// Specified in docs/store-protocol.md; change both together.
//
// Every integer is little-endian. A request is a 16-byte header followed by `body_bytes` of
// body; a reply is a 12-byte header followed by `body_bytes` of body. Every length and count
// is checked against the limits below before anything is allocated for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/auth.hpp"

namespace anview::bootstrap::store_protocol {

// 'A' 'V' 'S' 'T' on the wire (the little-endian u32 0x54535641).
inline constexpr std::uint32_t magic = 0x54535641;
// 2: the hello and prove ops (authentication with the job secret).
inline constexpr std::uint16_t version = 2;

inline constexpr std::size_t request_header_bytes = 16;
inline constexpr std::size_t reply_header_bytes = 12;

// Limits. A frame over any of them is a protocol violation; the server drops the connection.
// Key and value sizes are settings (ANVIEW_STORE_MAX_KEY, ANVIEW_STORE_MAX_VALUE) up to the
// ceilings below; the rest are fixed.
struct Limits {
  std::uint32_t max_key_bytes = 4096;
  std::uint32_t max_value_bytes = 64u << 20;
  // From the settings; a value out of range raises a usage Error naming it.
  static Limits configured();
};
inline constexpr std::uint32_t key_bytes_ceiling = 64u << 10;
inline constexpr std::uint32_t value_bytes_ceiling = 1u << 30;
inline constexpr std::uint32_t max_keys_per_request = 1024;
inline constexpr std::uint32_t max_error_text_bytes = 4096;

// hello and prove carry no keys: a client with the job secret sends hello (payload: its
// nonce; reply: the server's nonce and proof) and prove (payload: its proof) before anything
// else, and a server with a secret serves nothing else before a valid proof.
enum class Op : std::uint8_t {
  set = 1,
  get = 2,
  add = 3,
  check = 4,
  wait = 5,
  hello = 6,
  prove = 7
};
inline constexpr std::uint8_t op_count = 8;  // ops are 1 .. op_count - 1

enum class Status : std::uint8_t {
  ok = 0,
  version_mismatch = 1,  // body: text; the server closes the connection after it
  bad_request = 2,       // body: text; the server closes the connection after it
  bad_value = 3,         // body: text; the request failed, the connection stays usable
  unauthenticated = 4,   // body: text; the job secret was not proven; the server closes
};

const char* to_string(Op op) noexcept;

struct RequestHeader {
  std::uint32_t magic = store_protocol::magic;
  std::uint16_t version = store_protocol::version;
  std::uint8_t op = 0;
  std::uint8_t flags = 0;  // reserved, must be 0
  std::uint32_t key_count = 0;
  std::uint32_t body_bytes = 0;
};

struct ReplyHeader {
  std::uint32_t magic = store_protocol::magic;
  std::uint16_t version = store_protocol::version;
  std::uint8_t status = 0;
  std::uint8_t flags = 0;  // reserved, 0
  std::uint32_t body_bytes = 0;
};

// Little-endian field access.
inline void put_u16(std::uint8_t* p, std::uint16_t v) {
  p[0] = static_cast<std::uint8_t>(v);
  p[1] = static_cast<std::uint8_t>(v >> 8);
}
inline void put_u32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
inline void put_u64(std::uint8_t* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
inline std::uint16_t get_u16(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}
inline std::uint32_t get_u32(const std::uint8_t* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline std::uint64_t get_u64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void encode(const RequestHeader& h, std::uint8_t* out);  // request_header_bytes
RequestHeader decode_request_header(const std::uint8_t* in);
void encode(const ReplyHeader& h, std::uint8_t* out);  // reply_header_bytes
ReplyHeader decode_reply_header(const std::uint8_t* in);

// Checks a request header whose magic and version are right: op, flags, key count and body
// size against the limits of its op. Returns what is wrong, or nothing.
std::optional<std::string> check_request_header(const RequestHeader& h, const Limits& limits);

// A request's body: key_count keys, each a u32 length and its bytes, then the op's payload
// (set: the value; add: an i64 delta; others: nothing).
std::vector<std::uint8_t> encode_request_prefix(Op op, const std::vector<std::string>& keys,
                                                std::size_t payload_bytes);

struct Request {
  Op op{};
  std::vector<std::string> keys;
  std::string_view payload;  // points into the frame's buffer
};
// Parses a complete body (header already checked). Returns what is wrong, or nothing.
std::optional<std::string> decode_request_body(const RequestHeader& h, const std::uint8_t* body,
                                               const Limits& limits, Request& out);

inline constexpr std::uint32_t hello_reply_bytes = 16 + 32;  // server nonce, server proof

// The proofs of a store connection: HMAC-SHA256 over a role label and both nonces. The server
// sends server_proof with its nonce in the hello's reply; the client answers with
// client_proof in prove.
base::auth::Mac server_proof(const base::auth::Secret& secret, const base::auth::Nonce& client,
                             const base::auth::Nonce& server);
base::auth::Mac client_proof(const base::auth::Secret& secret, const base::auth::Nonce& client,
                             const base::auth::Nonce& server);

// Upper bound of a reply body the client accepts for `op` (error replies: error text).
std::uint32_t max_reply_body(Op op, Status status, const Limits& limits);

}  // namespace anview::bootstrap::store_protocol
