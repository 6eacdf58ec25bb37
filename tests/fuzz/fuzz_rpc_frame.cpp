// The RPC frame as a server (requests, cancels) and a client (replies) parse it
// (docs/rpc.md). Input: one byte choosing the limits (the default, or a small configured
// message limit), then the bytes of one message. A frame parse() accepts must respect the
// limits and encode back to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "check.hpp"
#include "patterns/rpc_frame.hpp"

namespace rpc = anview::patterns::rpc;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  rpc::Limits limits;
  if ((data[0] & 1) == 0) limits.max_message_bytes = 4096;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  rpc::Frame frame;
  std::string why;
  if (!rpc::parse(bytes, limits, frame, why)) {
    FUZZ_CHECK(!why.empty());
    return 0;
  }
  FUZZ_CHECK(frame.tensors.size() <= rpc::max_tensors);
  FUZZ_CHECK(frame.text.size() <= rpc::max_error_bytes);
  FUZZ_CHECK(frame.call_id < rpc::max_call_id);
  std::size_t total = frame.payload_bytes;
  for (const auto& t : frame.tensors) {
    FUZZ_CHECK(t.shape.size() <= rpc::max_dims);
    FUZZ_CHECK(t.bytes <= limits.max_message_bytes);
    total += t.bytes;
  }
  // What the frame makes a receiver allocate is bounded by the limit.
  FUZZ_CHECK(total <= limits.max_message_bytes);
  FUZZ_CHECK(frame.body_bytes() <= total);
  // Encoding the parsed fields gives the same bytes back.
  anview::Message message =
      frame.payload_inline()
          ? anview::Message::view(frame.inline_payload.data(), frame.inline_payload.size())
          : anview::Message::view(nullptr, frame.payload_bytes);
  for (const auto& t : frame.tensors)
    message.add_tensor({.dtype = t.dtype, .shape = t.shape, .data = nullptr});
  const auto again = rpc::encode(frame.kind, frame.flags & ~rpc::flag_inline_payload, frame.status,
                                 frame.call_id, frame.deadline_ms, frame.reply_capacity, frame.text,
                                 message, frame.payload_inline());
  FUZZ_CHECK(again.size() == bytes.size());
  FUZZ_CHECK(std::memcmp(again.data(), bytes.data(), bytes.size()) == 0);
  return 0;
}
