#include "bootstrap/store_protocol.hpp"

#include "base/config.hpp"

namespace anview::bootstrap::store_protocol {

const char* to_string(Op op) noexcept {
  switch (op) {
    case Op::set:
      return "set";
    case Op::get:
      return "get";
    case Op::add:
      return "add";
    case Op::check:
      return "check";
    case Op::wait:
      return "wait";
    case Op::hello:
      return "hello";
    case Op::prove:
      return "prove";
  }
  return "unknown";
}

void encode(const RequestHeader& h, std::uint8_t* out) {
  put_u32(out, h.magic);
  put_u16(out + 4, h.version);
  out[6] = h.op;
  out[7] = h.flags;
  put_u32(out + 8, h.key_count);
  put_u32(out + 12, h.body_bytes);
}

RequestHeader decode_request_header(const std::uint8_t* in) {
  RequestHeader h;
  h.magic = get_u32(in);
  h.version = get_u16(in + 4);
  h.op = in[6];
  h.flags = in[7];
  h.key_count = get_u32(in + 8);
  h.body_bytes = get_u32(in + 12);
  return h;
}

void encode(const ReplyHeader& h, std::uint8_t* out) {
  put_u32(out, h.magic);
  put_u16(out + 4, h.version);
  out[6] = h.status;
  out[7] = h.flags;
  put_u32(out + 8, h.body_bytes);
}

ReplyHeader decode_reply_header(const std::uint8_t* in) {
  ReplyHeader h;
  h.magic = get_u32(in);
  h.version = get_u16(in + 4);
  h.status = in[6];
  h.flags = in[7];
  h.body_bytes = get_u32(in + 8);
  return h;
}

namespace {

const base::Setting max_key_setting(
    "store", "ANVIEW_STORE_MAX_KEY", "4K",
    "Longest store key (1..64K); a request with a longer one is refused");
const base::Setting max_value_setting(
    "store", "ANVIEW_STORE_MAX_VALUE", "64M",
    "Largest store value (0..1G); a set of a larger one is refused");

std::uint64_t payload_bytes_max(Op op, const Limits& limits) {
  switch (op) {
    case Op::set:
      return limits.max_value_bytes;
    case Op::add:
      return 8;
    case Op::hello:
      return 16;  // the client's nonce
    case Op::prove:
      return 32;  // the client's proof
    default:
      return 0;
  }
}

bool carries_keys(Op op) {
  return op != Op::hello && op != Op::prove;
}

}  // namespace

Limits Limits::configured() {
  return Limits{
      .max_key_bytes = static_cast<std::uint32_t>(max_key_setting.as_int_in(1, key_bytes_ceiling)),
      .max_value_bytes =
          static_cast<std::uint32_t>(max_value_setting.as_int_in(0, value_bytes_ceiling))};
}

std::optional<std::string> check_request_header(const RequestHeader& h, const Limits& limits) {
  if (h.op == 0 || h.op >= op_count) return "unknown op " + std::to_string(h.op);
  const Op op = static_cast<Op>(h.op);
  if (h.flags != 0) return "reserved flags are " + std::to_string(h.flags) + ", not 0";
  if (!carries_keys(op)) {
    if (h.key_count != 0 || h.body_bytes != payload_bytes_max(op, limits))
      return std::string(to_string(op)) + " with " + std::to_string(h.key_count) + " keys and " +
             std::to_string(h.body_bytes) + " body bytes (allowed: 0 keys, " +
             std::to_string(payload_bytes_max(op, limits)) + " bytes)";
    return std::nullopt;
  }
  const bool many = op == Op::check || op == Op::wait;
  if (h.key_count == 0 || h.key_count > (many ? max_keys_per_request : 1u))
    return std::string(to_string(op)) + " with " + std::to_string(h.key_count) +
           " keys (allowed: 1.." + std::to_string(many ? max_keys_per_request : 1u) + ")";
  const std::uint64_t most =
      h.key_count * (4 + std::uint64_t{limits.max_key_bytes}) + payload_bytes_max(op, limits);
  const std::uint64_t least = h.key_count * std::uint64_t{5} + (op == Op::add ? 8 : 0);
  if (h.body_bytes > most || h.body_bytes < least)
    return std::string(to_string(op)) + " body of " + std::to_string(h.body_bytes) + " bytes for " +
           std::to_string(h.key_count) + (h.key_count == 1 ? " key" : " keys") +
           " (allowed: " + std::to_string(least) + ".." + std::to_string(most) + ")";
  return std::nullopt;
}

std::vector<std::uint8_t> encode_request_prefix(Op op, const std::vector<std::string>& keys,
                                                std::size_t payload_bytes) {
  std::size_t body = payload_bytes;
  for (const auto& k : keys) body += 4 + k.size();
  std::vector<std::uint8_t> out(request_header_bytes + body - payload_bytes);
  RequestHeader h;
  h.op = static_cast<std::uint8_t>(op);
  h.key_count = static_cast<std::uint32_t>(keys.size());
  h.body_bytes = static_cast<std::uint32_t>(body);
  encode(h, out.data());
  std::uint8_t* p = out.data() + request_header_bytes;
  for (const auto& k : keys) {
    put_u32(p, static_cast<std::uint32_t>(k.size()));
    if (!k.empty()) std::memcpy(p + 4, k.data(), k.size());
    p += 4 + k.size();
  }
  return out;
}

std::optional<std::string> decode_request_body(const RequestHeader& h, const std::uint8_t* body,
                                               const Limits& limits, Request& out) {
  const Op op = static_cast<Op>(h.op);
  out.op = op;
  out.keys.clear();
  out.keys.reserve(h.key_count);  // bounded by max_keys_per_request (header checked)
  std::size_t at = 0;
  for (std::uint32_t i = 0; i < h.key_count; ++i) {
    if (h.body_bytes - at < 4) return "body ends inside the length of key " + std::to_string(i);
    const std::uint32_t len = get_u32(body + at);
    at += 4;
    if (len == 0 || len > limits.max_key_bytes)
      return "key " + std::to_string(i) + " is " + std::to_string(len) + " bytes (allowed: 1.." +
             std::to_string(limits.max_key_bytes) + ", ANVIEW_STORE_MAX_KEY)";
    if (h.body_bytes - at < len) return "key " + std::to_string(i) + " runs past the body";
    out.keys.emplace_back(reinterpret_cast<const char*>(body + at), len);
    at += len;
  }
  const std::size_t payload = h.body_bytes - at;
  const bool ok =
      op == Op::set ? payload <= limits.max_value_bytes : payload == payload_bytes_max(op, limits);
  if (!ok)
    return std::to_string(payload) + " payload bytes after the keys of a " + to_string(op) +
           " request" +
           (op == Op::set ? " (allowed: up to " + std::to_string(limits.max_value_bytes) +
                                ", ANVIEW_STORE_MAX_VALUE)"
                          : std::string());
  out.payload = std::string_view(reinterpret_cast<const char*>(body + at), payload);
  return std::nullopt;
}

namespace {

base::auth::Mac proof(const base::auth::Secret& secret, const char* role,
                      const base::auth::Nonce& client, const base::auth::Nonce& server) {
  base::auth::MacInput in;
  in.text(role).bytes(client).bytes(server);
  return secret.mac(in);
}

}  // namespace

base::auth::Mac server_proof(const base::auth::Secret& secret, const base::auth::Nonce& client,
                             const base::auth::Nonce& server) {
  return proof(secret, "anview store accept", client, server);
}

base::auth::Mac client_proof(const base::auth::Secret& secret, const base::auth::Nonce& client,
                             const base::auth::Nonce& server) {
  return proof(secret, "anview store connect", client, server);
}

std::uint32_t max_reply_body(Op op, Status status, const Limits& limits) {
  if (status != Status::ok) return max_error_text_bytes;
  switch (op) {
    case Op::get:
      return limits.max_value_bytes;
    case Op::add:
      return 8;
    case Op::check:
      return 1;
    case Op::hello:
      return hello_reply_bytes;
    default:
      return 0;
  }
}

}  // namespace anview::bootstrap::store_protocol
