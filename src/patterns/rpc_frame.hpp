// The RPC frame (docs/rpc.md): the first message of a request, a reply or a cancel. Encoded
// and parsed here only; parse() checks every length and count against limits before use, and
// says what is wrong with a frame it refuses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "anview/message.hpp"
#include "anview/types.hpp"

namespace anview::patterns::rpc {

inline constexpr std::uint32_t frame_magic = 0x50525641;  // "AVRP" on the wire
inline constexpr std::uint8_t frame_version = 1;
inline constexpr std::size_t header_bytes = 40;
inline constexpr std::size_t tensor_desc_bytes = 8;  // then 8 bytes per dimension
inline constexpr std::size_t max_dims = 8;
inline constexpr std::size_t max_tensors = 64;
inline constexpr std::size_t max_method_bytes = 256;
inline constexpr std::size_t max_error_bytes = 4096;
// The buffer a server receives each request's first message into: a request whose frame and
// payload fit send the payload inline; others send it as a message of its own.
inline constexpr std::size_t request_capacity = 64 * 1024;
// The largest reply frame without its payload: an error's text, or the descriptions of the
// most tensors with the most dimensions (an error reply carries no tensors). A client's first
// reply buffer holds at least this, so every reply's frame fits it.
inline constexpr std::size_t max_reply_frame_bytes =
    header_bytes + (max_error_bytes > max_tensors * (tensor_desc_bytes + 8 * max_dims)
                        ? max_error_bytes
                        : max_tensors * (tensor_desc_bytes + 8 * max_dims));
// Call ids stay below this, so a call's tags fit beside each other (see the tags below).
inline constexpr std::uint64_t max_call_id = std::uint64_t{1} << 40;

// Tags on an RPC connection (or an RPC communicator): requests and cancels on request_tag;
// a request's payload and tensors on request_data_tag(id); the reply and its parts on
// reply_tag(id).
inline constexpr Tag request_tag{1};
inline constexpr Tag request_data_tag(std::uint64_t id) {
  return Tag{max_call_id + id};
}
inline constexpr Tag reply_tag(std::uint64_t id) {
  return Tag{2 * max_call_id + id};
}

enum class Kind : std::uint8_t { request = 1, reply = 2, cancel = 3 };
enum class ReplyStatus : std::uint8_t {
  ok = 0,
  unknown_method = 1,
  handler_error = 2,
  deadline_exceeded = 3,
  cancelled = 4,
  bad_request = 5,
  shutting_down = 6,
};
const char* to_string(ReplyStatus status);

inline constexpr std::uint8_t flag_idempotent = 1;
inline constexpr std::uint8_t flag_inline_payload = 2;  // the payload follows in this message
inline constexpr std::uint8_t known_flags = flag_idempotent | flag_inline_payload;

struct TensorDesc {
  DataType dtype = DataType::uint8;
  std::vector<std::int64_t> shape;
  std::size_t bytes = 0;
};

struct Frame {
  Kind kind = Kind::request;
  std::uint8_t flags = 0;
  ReplyStatus status = ReplyStatus::ok;
  std::uint64_t call_id = 0;
  std::uint32_t deadline_ms = 0;     // requests: time the client still waits (0: none)
  std::uint32_t reply_capacity = 0;  // requests: bytes the client's first reply buffer holds
  std::uint64_t payload_bytes = 0;
  std::string_view text;  // method (request) or error message (reply)
  std::vector<TensorDesc> tensors;
  std::span<const std::byte> inline_payload;  // when flags has flag_inline_payload

  bool payload_inline() const { return (flags & flag_inline_payload) != 0; }
  // Bytes that follow this message (payload when not inline, then tensors).
  std::size_t body_bytes() const;
};

struct Limits {
  std::size_t max_message_bytes = std::size_t{1} << 30;
};

// The size of the frame encode() writes for these fields.
std::size_t frame_size(std::string_view text, const std::vector<Tensor>& tensors,
                       std::size_t inline_payload_bytes);
// Writes the frame (payload inline when `inline_payload` is set) and returns it.
std::vector<std::byte> encode(Kind kind, std::uint8_t flags, ReplyStatus status,
                              std::uint64_t call_id, std::uint32_t deadline_ms,
                              std::uint32_t reply_capacity, std::string_view text,
                              const Message& message, bool inline_payload);

// Parses `bytes` (one whole message). On a malformed frame returns false and says why in
// `why`; `out` then holds nothing usable. The views in `out` point into `bytes`.
bool parse(std::span<const std::byte> bytes, const Limits& limits, Frame& out, std::string& why);

}  // namespace anview::patterns::rpc
