// Constants and helpers shared by the TCP transport's files for links of several paths.
// Private to transport/tcp.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace anview::transport::tcp {

// How often links of several paths are checked (path health, probes, keepalives).
inline constexpr auto multipath_tick = std::chrono::milliseconds(50);
// A path connected again gets this long to answer.
inline constexpr auto path_connect_timeout = std::chrono::seconds(2);
// A failed path is probed again after this, doubling up to max_probe while it stays down.
inline constexpr auto first_probe = std::chrono::milliseconds(250);
inline constexpr auto max_probe = std::chrono::seconds(4);
// At start-up (no path up yet: the peer may not listen yet) paths are tried more often.
inline constexpr auto startup_probe = std::chrono::milliseconds(10);
inline constexpr auto max_startup_probe = std::chrono::milliseconds(500);
// A stream pulls data chunks while it has fewer bytes than this queued (on top of what its
// kernel buffer holds): enough to keep it busy, little enough that a slow path never holds
// much of a message.
inline constexpr std::size_t feed_limit = std::size_t{1} << 20;
// An ordered frame's acknowledgement can wait for this many frames or bytes.
inline constexpr std::uint64_t ack_every_frames = 64;
inline constexpr std::uint64_t ack_every_bytes = std::uint64_t{256} << 10;

// Receiver-driven flow control (ANVIEW_TCP_CREDIT): each data stream starts with this much
// credit; a receiver shares its budget among the peers that sent data within
// `active_sender_window`, never granting a stream less than `min_credit` at a time.
inline constexpr std::uint64_t initial_credit = std::uint64_t{256} << 10;
inline constexpr std::uint64_t min_credit = std::uint64_t{64} << 10;
inline constexpr auto active_sender_window = std::chrono::milliseconds(20);

// Serial-number comparison of 16-bit path generations: true when `a` is newer than `b`.
inline bool newer(std::uint16_t a, std::uint16_t b) {
  return static_cast<std::int16_t>(static_cast<std::uint16_t>(a - b)) > 0;
}

}  // namespace anview::transport::tcp
