// The unit every transport moves: a 32-byte header, optionally followed by a payload.
// The header layout is part of the wire format (docs/wire-protocol.md); transports carry it
// without interpreting the fields, except payload_bytes (how much follows) and reserved (must
// be zero). The p2p layer gives type, tag, id and arg their meaning.
#pragma once

#include <cstdint>

namespace anview::transport {

struct FrameHeader {
  std::uint8_t type = 0;
  std::uint8_t flags = 0;
  std::uint16_t reserved = 0;
  std::uint32_t payload_bytes = 0;
  std::uint64_t tag = 0;
  std::uint64_t id = 0;
  std::uint64_t arg = 0;
  bool operator==(const FrameHeader&) const = default;
};
static_assert(sizeof(FrameHeader) == 32, "FrameHeader is a wire format");

// A header announcing more payload than ANVIEW_MAX_FRAME (base/limits.hpp) is a protocol
// error.

}  // namespace anview::transport
