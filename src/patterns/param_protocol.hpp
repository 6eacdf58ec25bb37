// What the parameter server's RPC methods carry (docs/param-server.md): a text header of
// lines in the Message's bytes, values as tensor attachments, and the ring as text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "anview/param_server.hpp"

namespace anview::patterns::param {

inline constexpr const char* push_method = "ps.push";
inline constexpr const char* pull_method = "ps.pull";
inline constexpr const char* set_method = "ps.set";
inline constexpr const char* ring_method = "ps.ring";
inline constexpr const char* adopt_method = "ps.adopt";
inline constexpr const char* settle_method = "ps.settle";
// "key\nhandover id\n": did this server take that handover? "ok\napplied\n", or
// "ok\nrefused\n" (it did not, and will not should it still come).
inline constexpr const char* recall_method = "ps.recall";

// Replies start with "ok\n", or "moved\n" and the ring the server knows.
inline constexpr std::string_view ok_reply = "ok\n";
inline constexpr std::string_view moved_reply = "moved\n";

struct RingState {
  std::uint64_t epoch = 0;
  HashRing ring;
};
// "epoch vnodes\nserver\nserver..."
std::string ring_text(std::uint64_t epoch, const HashRing& ring);
// nullopt for a malformed text.
std::optional<RingState> parse_ring(std::string_view text);

// The lines of a header ("key\nstep\n..."); a key may not contain a newline.
std::vector<std::string_view> lines(std::string_view text);
std::optional<std::uint64_t> number(std::string_view text);

}  // namespace anview::patterns::param
