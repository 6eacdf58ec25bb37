// The store protocol as a server and a client parse it (docs/store-protocol.md): a request
// header, its checks against the limits, the body's keys and payload; a reply header and its
// body limit. Input: one byte choosing the limits (the defaults, or small configured ones),
// then the bytes that arrive on a connection.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "bootstrap/store_protocol.hpp"
#include "check.hpp"

namespace proto = anview::bootstrap::store_protocol;

namespace {

void parse_reply(const std::uint8_t* data, std::size_t size, const proto::Limits& limits) {
  if (size < proto::reply_header_bytes) return;
  const proto::ReplyHeader h = proto::decode_reply_header(data);
  std::uint8_t again[proto::reply_header_bytes];
  proto::encode(h, again);
  FUZZ_CHECK(std::memcmp(again, data, sizeof again) == 0);
  if (h.status > static_cast<std::uint8_t>(proto::Status::unauthenticated)) return;
  for (std::uint8_t op = 1; op < proto::op_count; ++op) {
    const std::uint32_t most = proto::max_reply_body(static_cast<proto::Op>(op),
                                                     static_cast<proto::Status>(h.status), limits);
    FUZZ_CHECK(most <= proto::value_bytes_ceiling);
  }
}

void parse_request(const std::uint8_t* data, std::size_t size, const proto::Limits& limits) {
  if (size < proto::request_header_bytes) return;
  const proto::RequestHeader h = proto::decode_request_header(data);
  std::uint8_t again[proto::request_header_bytes];
  proto::encode(h, again);
  FUZZ_CHECK(std::memcmp(again, data, sizeof again) == 0);
  if (h.magic != proto::magic || h.version != proto::version) return;
  if (proto::check_request_header(h, limits)) return;
  // What the header lets a peer make the server buffer: bounded by the limits.
  FUZZ_CHECK(h.key_count <= proto::max_keys_per_request);
  FUZZ_CHECK(h.body_bytes <= std::uint64_t{h.key_count} * (4 + limits.max_key_bytes) +
                                 std::max<std::uint32_t>(limits.max_value_bytes, 32));
  // The server reads exactly body_bytes: give the parser exactly that (ASan sees over-reads).
  if (size - proto::request_header_bytes < h.body_bytes) return;
  const std::vector<std::uint8_t> body(data + proto::request_header_bytes,
                                       data + proto::request_header_bytes + h.body_bytes);
  proto::Request request;
  if (proto::decode_request_body(h, body.data(), limits, request)) return;
  FUZZ_CHECK(request.op == static_cast<proto::Op>(h.op));
  FUZZ_CHECK(request.keys.size() == h.key_count);
  for (const auto& key : request.keys)
    FUZZ_CHECK(!key.empty() && key.size() <= limits.max_key_bytes);
  if (request.op == proto::Op::set) FUZZ_CHECK(request.payload.size() <= limits.max_value_bytes);
  // An accepted request is the canonical encoding of what was parsed from it.
  const auto prefix =
      proto::encode_request_prefix(request.op, request.keys, request.payload.size());
  FUZZ_CHECK(prefix.size() + request.payload.size() == proto::request_header_bytes + h.body_bytes);
  FUZZ_CHECK(std::memcmp(prefix.data(), data, prefix.size()) == 0);
  FUZZ_CHECK(reinterpret_cast<const std::uint8_t*>(request.payload.data()) ==
             body.data() + (prefix.size() - proto::request_header_bytes));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const proto::Limits limits = (data[0] & 1) != 0
                                   ? proto::Limits{}
                                   : proto::Limits{.max_key_bytes = 16, .max_value_bytes = 64};
  parse_request(data + 1, size - 1, limits);
  parse_reply(data + 1, size - 1, limits);
  return 0;
}
