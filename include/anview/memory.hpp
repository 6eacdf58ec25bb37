// One-sided access: memory a rank registers so that its peers can put bytes into it and get
// bytes from it with no code on its side (docs/one-sided.md).
//
//   anview::MemoryRegion region = comm.register_memory(kv_cache, bytes);
//   auto key = region.key().pack();           // send these bytes to the peers that need them
//   ...                                        // on a peer:
//   auto key = anview::RemoteKey::unpack(bytes_received);
//   comm.get(local, n, key, offset).wait();   // reads the owner's memory
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace anview {

namespace p2p {
class Messenger;
}

// What a peer needs to reach a registered region: plain data, valid within the communicator
// that registered it. pack()/unpack() turn it into bytes for sending (host byte order: the
// ranks of a job share it).
struct RemoteKey {
  int rank = -1;              // the owner
  std::uint64_t token = 0;    // names the registration; never reused by its communicator
  std::uint64_t address = 0;  // the region's first byte in the owner's memory
  std::uint64_t bytes = 0;    // its size
  std::uint64_t record = 0;   // where the owner keeps the registration (checked before use)
  std::int32_t pid = 0;       // the owner's process
  std::int32_t fd = -1;       // allocate_memory: the owner's shared-memory descriptor, else -1

  static constexpr std::size_t packed_bytes = 48;
  std::array<std::byte, packed_bytes> pack() const;
  // Raises Error(usage) when `data` is not a packed key.
  static RemoteKey unpack(std::span<const std::byte> data);
};

// A registered region of this rank's memory (register_memory), or memory Anview allocated
// for one (allocate_memory: freed with the region); deregistered when destroyed.
// The memory must stay valid while registered, and deregistering while a peer's put or get
// into it is in flight is an error of the program (as in MPI and UCX): a put that arrives
// after deregistration is rejected, and nothing is written.
class MemoryRegion {
 public:
  MemoryRegion() = default;
  MemoryRegion(MemoryRegion&& other) noexcept;
  MemoryRegion& operator=(MemoryRegion&& other) noexcept;
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;
  ~MemoryRegion();

  bool valid() const { return messenger_ != nullptr; }
  void* data() const { return reinterpret_cast<void*>(key_.address); }
  std::size_t size() const { return static_cast<std::size_t>(key_.bytes); }
  const RemoteKey& key() const { return key_; }
  // Peers' puts and gets naming this region fail from now on; the handle becomes empty.
  void deregister();

  // Made by Communicator::register_memory.
  MemoryRegion(std::shared_ptr<p2p::Messenger> messenger, RemoteKey key)
      : messenger_(std::move(messenger)), key_(key) {}

 private:
  std::shared_ptr<p2p::Messenger> messenger_;
  RemoteKey key_;
};

}  // namespace anview
