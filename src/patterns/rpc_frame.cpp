#include "patterns/rpc_frame.hpp"

#include <cstring>

#include "patterns/wire.hpp"

namespace anview::patterns::rpc {
namespace {

constexpr auto last_dtype = static_cast<std::uint8_t>(DataType::float64);

using wire::load;
using wire::refuse;
using wire::store;

}  // namespace

const char* to_string(ReplyStatus status) {
  switch (status) {
    case ReplyStatus::ok:
      return "ok";
    case ReplyStatus::unknown_method:
      return "unknown method";
    case ReplyStatus::handler_error:
      return "handler error";
    case ReplyStatus::deadline_exceeded:
      return "deadline exceeded";
    case ReplyStatus::cancelled:
      return "cancelled";
    case ReplyStatus::bad_request:
      return "bad request";
    case ReplyStatus::shutting_down:
      return "server shutting down";
  }
  return "unknown status";
}

std::size_t Frame::body_bytes() const {
  std::size_t total = payload_inline() ? 0 : payload_bytes;
  for (const auto& t : tensors) total += t.bytes;
  return total;
}

std::size_t frame_size(std::string_view text, const std::vector<Tensor>& tensors,
                       std::size_t inline_payload_bytes) {
  std::size_t size = header_bytes + text.size() + inline_payload_bytes;
  for (const auto& t : tensors) size += tensor_desc_bytes + 8 * t.shape.size();
  return size;
}

std::vector<std::byte> encode(Kind kind, std::uint8_t flags, ReplyStatus status,
                              std::uint64_t call_id, std::uint32_t deadline_ms,
                              std::uint32_t reply_capacity, std::string_view text,
                              const Message& message, bool inline_payload) {
  if (inline_payload) flags |= flag_inline_payload;
  const auto& tensors = message.tensors();
  std::vector<std::byte> out(frame_size(text, tensors, inline_payload ? message.size() : 0));
  std::byte* at = out.data();
  store<std::uint32_t>(at, frame_magic);
  store<std::uint8_t>(at, frame_version);
  store<std::uint8_t>(at, static_cast<std::uint8_t>(kind));
  store<std::uint8_t>(at, flags);
  store<std::uint8_t>(at, static_cast<std::uint8_t>(status));
  store<std::uint64_t>(at, call_id);
  store<std::uint32_t>(at, deadline_ms);
  store<std::uint32_t>(at, reply_capacity);
  store<std::uint64_t>(at, message.size());
  store<std::uint32_t>(at, static_cast<std::uint32_t>(text.size()));
  store<std::uint16_t>(at, static_cast<std::uint16_t>(tensors.size()));
  store<std::uint16_t>(at, 0);
  for (const auto& t : tensors) {
    store<std::uint8_t>(at, static_cast<std::uint8_t>(t.dtype));
    store<std::uint8_t>(at, static_cast<std::uint8_t>(t.shape.size()));
    store<std::uint16_t>(at, 0);
    store<std::uint32_t>(at, 0);
    for (auto d : t.shape) store<std::int64_t>(at, d);
  }
  if (!text.empty()) std::memcpy(at, text.data(), text.size());
  at += text.size();
  if (inline_payload && message.size() > 0) std::memcpy(at, message.bytes().data(), message.size());
  return out;
}

bool parse(std::span<const std::byte> bytes, const Limits& limits, Frame& out, std::string& why) {
  out = Frame{};
  if (bytes.size() < header_bytes)
    return refuse(why, "frame of " + std::to_string(bytes.size()) + " bytes, shorter than its " +
                           std::to_string(header_bytes) + "-byte header");
  const std::byte* p = bytes.data();
  if (load<std::uint32_t>(p) != frame_magic) return refuse(why, "not an RPC frame (bad magic)");
  if (load<std::uint8_t>(p + 4) != frame_version)
    return refuse(why, "RPC frame version " + std::to_string(load<std::uint8_t>(p + 4)) +
                           ", this side speaks " + std::to_string(frame_version));
  const auto kind = load<std::uint8_t>(p + 5);
  if (kind < 1 || kind > 3) return refuse(why, "unknown frame kind " + std::to_string(kind));
  out.kind = static_cast<Kind>(kind);
  out.flags = load<std::uint8_t>(p + 6);
  if ((out.flags & ~known_flags) != 0)
    return refuse(why, "unknown frame flags " + std::to_string(out.flags));
  const auto status = load<std::uint8_t>(p + 7);
  if (status > static_cast<std::uint8_t>(ReplyStatus::shutting_down))
    return refuse(why, "unknown reply status " + std::to_string(status));
  out.status = static_cast<ReplyStatus>(status);
  out.call_id = load<std::uint64_t>(p + 8);
  if (out.call_id >= max_call_id)
    return refuse(why, "call id " + std::to_string(out.call_id) + " out of range");
  out.deadline_ms = load<std::uint32_t>(p + 16);
  out.reply_capacity = load<std::uint32_t>(p + 20);
  out.payload_bytes = load<std::uint64_t>(p + 24);
  const auto text_bytes = load<std::uint32_t>(p + 32);
  const auto tensor_count = load<std::uint16_t>(p + 36);
  if (load<std::uint16_t>(p + 38) != 0) return refuse(why, "reserved header bytes are not zero");
  const std::size_t max_text = out.kind == Kind::reply ? max_error_bytes : max_method_bytes;
  if (text_bytes > max_text)
    return refuse(why, (out.kind == Kind::reply ? "error text of " : "method name of ") +
                           std::to_string(text_bytes) + " bytes (limit " +
                           std::to_string(max_text) + ")");
  if (tensor_count > max_tensors)
    return refuse(
        why, std::to_string(tensor_count) + " tensors (limit " + std::to_string(max_tensors) + ")");
  if (out.payload_bytes > limits.max_message_bytes)
    return refuse(why, "payload of " + std::to_string(out.payload_bytes) + " bytes (limit " +
                           std::to_string(limits.max_message_bytes) + ")");
  std::size_t total = out.payload_bytes;
  std::size_t at = header_bytes;
  out.tensors.reserve(tensor_count);
  for (unsigned i = 0; i < tensor_count; ++i) {
    if (bytes.size() - at < tensor_desc_bytes)
      return refuse(why, "frame ends inside tensor " + std::to_string(i));
    TensorDesc t;
    const auto dtype = load<std::uint8_t>(p + at);
    const auto ndim = load<std::uint8_t>(p + at + 1);
    if (dtype > last_dtype)
      return refuse(why,
                    "tensor " + std::to_string(i) + " has unknown dtype " + std::to_string(dtype));
    if (ndim > max_dims)
      return refuse(why, "tensor " + std::to_string(i) + " has " + std::to_string(ndim) +
                             " dimensions (limit " + std::to_string(max_dims) + ")");
    if (load<std::uint16_t>(p + at + 2) != 0 || load<std::uint32_t>(p + at + 4) != 0)
      return refuse(why, "reserved tensor bytes are not zero");
    at += tensor_desc_bytes;
    if (bytes.size() - at < 8 * std::size_t{ndim})
      return refuse(why, "frame ends inside the shape of tensor " + std::to_string(i));
    t.dtype = static_cast<DataType>(dtype);
    std::size_t elements = 1;
    for (unsigned d = 0; d < ndim; ++d, at += 8) {
      const auto dim = load<std::int64_t>(p + at);
      if (dim < 0 || static_cast<std::uint64_t>(dim) > limits.max_message_bytes)
        return refuse(why, "tensor " + std::to_string(i) + " dimension " + std::to_string(d) +
                               " is " + std::to_string(dim));
      t.shape.push_back(dim);
      // elements <= limit and dim <= limit: the product fits in 64 bits before the check.
      elements *= static_cast<std::size_t>(dim);
      if (elements > limits.max_message_bytes) elements = limits.max_message_bytes + 1;
    }
    t.bytes = elements > limits.max_message_bytes ? limits.max_message_bytes + 1
                                                  : elements * size_of(t.dtype);
    total += t.bytes;
    if (t.bytes > limits.max_message_bytes || total > limits.max_message_bytes)
      return refuse(why, "message of more than " + std::to_string(limits.max_message_bytes) +
                             " bytes (the limit)");
    out.tensors.push_back(std::move(t));
  }
  if (bytes.size() - at < text_bytes) return refuse(why, "frame ends inside its text");
  out.text = {reinterpret_cast<const char*>(p + at), text_bytes};
  at += text_bytes;
  const std::size_t rest = bytes.size() - at;
  if (out.payload_inline()) {
    if (rest != out.payload_bytes)
      return refuse(why, "inline payload of " + std::to_string(rest) + " bytes, header says " +
                             std::to_string(out.payload_bytes));
    out.inline_payload = bytes.subspan(at, rest);
  } else if (rest != 0) {
    return refuse(why, std::to_string(rest) + " stray bytes after the frame");
  }
  if (out.kind == Kind::request && out.text.empty())
    return refuse(why, "request without a method name");
  return true;
}

}  // namespace anview::patterns::rpc
