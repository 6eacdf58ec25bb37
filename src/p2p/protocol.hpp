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
};

inline constexpr std::uint8_t cts_reject = 1;

// A rendezvous message may not announce more than this (no allocation depends on it, but a
// larger value can only be garbage).
inline constexpr std::uint64_t max_message_bytes = std::uint64_t{1} << 48;

}  // namespace anview::p2p
