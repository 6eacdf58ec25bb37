// How two ranks on one host attach to each other's shared memory (docs/wire-protocol.md,
// "Shared memory").
//
// Every rank owns one segment: an anonymous memfd (it has no name, so nothing is left in
// /dev/shm whatever happens to the process) holding a control page, one ring slot per rank
// of the communicator (slot s is the ring rank s writes to us), and the rank's shared area
// (Transport::own_area: only this rank writes it, every same-host peer maps it read-only). A slot's
// pages are touched only once its producer talks to us, so the unused ones cost no memory. The rank
// publishes its pid and the memfd's number through the bootstrap store; a peer maps the slot it
// writes to through /proc/<pid>/fd/<n> (as UCX's posix transport does), after checking the layout
// version.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/shm/ring.hpp"

namespace anview::transport::shm {

inline constexpr std::uint32_t segment_magic = 0x53564e41;  // "ANVS"
inline constexpr std::uint32_t segment_version = 3;         // 3: the size is sealed
inline constexpr std::size_t page_bytes = 4096;

// The first page of a segment.
struct SegmentControl {
  std::uint32_t magic;
  std::uint32_t version;
  std::uint32_t slots;
  std::uint32_t area_bytes;  // the shared area after the last slot
  std::uint64_t ring_bytes;
  // Set by the owner before it sleeps in the kernel, cleared when it wakes; whoever gives the
  // owner work (data in its inbound rings, space in its outbound rings) swaps it to 0 and, if it
  // was set, sends the owner a wake-up datagram.
  alignas(cache_line) std::atomic<std::uint32_t> sleeping;
};

inline std::size_t slot_bytes(std::size_t ring_bytes) {
  return ring_data_offset + ring_bytes;
}
inline std::size_t slot_offset(int slot, std::size_t ring_bytes) {
  return page_bytes + static_cast<std::size_t>(slot) * slot_bytes(ring_bytes);
}

// The shared area: a cache line, a ring of 16 collective call headers (a cache line each) and
// one of 16 payloads of 4 KiB, then two payload slots of 256 KiB (src/collectives/shared.cpp
// lays it out).
inline constexpr std::size_t area_bytes = 145 * page_bytes;
inline std::size_t area_offset(int slots, std::size_t ring_bytes) {
  return slot_offset(slots, ring_bytes);
}

// What a rank publishes for the shm transport (PeerInfo::endpoints["shm"]).
struct Endpoint {
  int pid = 0;
  int segment_fd = -1;
  std::uint64_t ring_bytes = 0;
  std::string wake_name;            // abstract unix datagram socket that wakes the rank
  std::uint64_t probe_address = 0;  // 8 bytes holding probe_value, to test cross-memory attach
};

std::string encode_endpoint(const Endpoint& endpoint);
// False (with the reason) when the text is not a valid endpoint of this version.
bool decode_endpoint(const std::string& text, Endpoint& out, std::string* why);

// A shared mapping, unmapped on destruction.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* address, std::size_t bytes) : address_(address), bytes_(bytes) {}
  Mapping(Mapping&& other) noexcept { *this = std::move(other); }
  Mapping& operator=(Mapping&& other) noexcept;
  ~Mapping();
  char* data() const { return static_cast<char*>(address_); }
  explicit operator bool() const { return address_ != nullptr; }

 private:
  void* address_ = nullptr;
  std::size_t bytes_ = 0;
};

// Maps `bytes` at `offset` of the segment file `fd`; on failure returns an empty mapping and
// sets `why`.
Mapping map_shared(int fd, std::size_t offset, std::size_t bytes, std::string* why,
                   bool writable = true);

// Opens another process's segment through /proc/<pid>/fd/<fd>; -1 and `why` on failure.
int open_peer_segment(int pid, int fd, std::string* why);

}  // namespace anview::transport::shm
