// The p2p protocol's use of transport::FrameHeader (docs/wire-protocol.md, "Frames").
#pragma once

#include <cstdint>

namespace anview::p2p {

enum class FrameType : std::uint8_t {
  eager = 1,  // tag; payload = the whole message
  rts = 2,    // ready to send: tag, id = sender's request id, arg = message bytes
  cts = 3,    // clear to send: id = sender's request id, arg = receiver's request id
              //   flags & cts_reject: the receive buffer is too small, arg = its capacity
  data = 4,   // rendezvous payload: id = receiver's request id, arg = offset in the message
  // One-sided access, emulated where the transport has no native path (one_sided.cpp):
  put = 5,       // tag = region token, id = initiator's operation id, arg = offset in the
                 //   region; payload = the bytes to write there
  put_ack = 6,   // id = operation id, arg = bytes written; flags = a rma_reject reason
  get = 7,       // tag = region token, id = operation id, arg = offset in the region;
                 //   payload = get_request
  get_data = 8,  // id = operation id, arg = offset in the get; payload = the bytes read; or
                 //   no payload and flags = a rma_reject reason
  // One-sided access through the transport's native path (one_sided_native.cpp):
  key_request = 9,     // tag = region token: send me the region's native key
  key_reply = 10,      // tag = region token; payload = KeyReply, then the transport's packed
                       //   key; or no payload and flags = a rma_reject reason
  key_withdraw = 11,   // tag = region token: drop its key, flush what you issued with it, answer
  key_withdrawn = 12,  // tag = region token: done; the owner may release the registration
};

inline constexpr std::uint8_t cts_reject = 1;

// Why a target refused a put or get (put_ack / get_data flags).
enum class RmaReject : std::uint8_t {
  none = 0,
  unknown_region = 1,  // the token names no region registered there now
  outside_region = 2,  // the range does not fit the region
  no_native_key = 3,   // key_reply: the transport could not register the region natively
                       //   (the initiator uses frames for it instead)
};

// The head of a key_reply payload: what the region is, as the owner registered it.
struct KeyReply {
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
};
static_assert(sizeof(KeyReply) == 16, "KeyReply is a wire format");

// A transport's packed key is a few hundred bytes at most (UCX: per memory domain); a key
// reply announcing more is garbage.
inline constexpr std::uint32_t max_key_reply_bytes = 64 * 1024;

// The payload of a get frame.
struct GetRequest {
  std::uint64_t bytes = 0;     // how many bytes to read
  std::uint64_t reserved = 0;  // zero
};
static_assert(sizeof(GetRequest) == 16, "GetRequest is a wire format");

// A rendezvous message may not announce more than this (no allocation depends on it, but a
// larger value can only be garbage).
inline constexpr std::uint64_t max_message_bytes = std::uint64_t{1} << 48;

}  // namespace anview::p2p
