// Small value types of the public API.
#pragma once

#include <cstddef>
#include <cstdint>

namespace anview {

// A message tag. A strong type, so a tag and a rank cannot be swapped by accident:
// comm.send(buf, n, /*peer=*/1, anview::Tag{7}).
enum class Tag : std::uint64_t {};

// Receives match any tag with any_tag; user tags must be below reserved_tags.
inline constexpr Tag any_tag{~std::uint64_t{0}};
inline constexpr std::uint64_t reserved_tags = std::uint64_t{1} << 63;

// Receives match any sender with any_source.
inline constexpr int any_source = -1;

// What a completed request moved.
struct Status {
  int source = -1;    // the sender (for receives: the matched sender)
  Tag tag{0};         // the matched tag
  std::size_t bytes = 0;  // bytes received (receives) or sent (sends)
};

constexpr std::uint64_t to_underlying(Tag tag) { return static_cast<std::uint64_t>(tag); }

}  // namespace anview
