// Cross-memory attach between two processes of one host: the copy loop every single-copy path
// of the shm transport uses, and PeerMemory (transport.hpp): the reads same-host collectives make
// of their peers' buffers, and one-sided put/get on registered regions. Any transport that
// serves a peer on this host offers it (shm, and ucx for same-host peers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/transport.hpp"

namespace anview::transport {

// Copies `bytes` between `local` and address `remote` of process `pid` (process_vm_writev when
// `to_peer`, else process_vm_readv), resuming after partial copies. 0, or the errno that
// stopped it (EIO for a copy that made no progress).
int copy_cross_memory(int pid, bool to_peer, char* local, std::uint64_t remote, std::size_t bytes);

// The ErrorKind and cause text for a failed cross-memory copy with `rank`'s process.
ErrorKind cross_memory_error_kind(int err);
std::string cross_memory_cause(int err, bool to_peer, int rank, int pid, std::size_t bytes);

// A word with this value is published by each rank so a peer can test cross-memory attach.
inline constexpr std::uint64_t probe_value = 0x414e5649455750ull;

// True when process_vm_readv of `pid`'s 8 bytes at `address` works and reads probe_value;
// else false with why (ptrace restrictions, another pid namespace, ...).
bool probe_cross_memory_attach(int pid, std::uint64_t address, std::string* why);

class CrossMemoryAccess final : public PeerMemory {
 public:
  CrossMemoryAccess(int rank, int peer, int pid) : rank_(rank), peer_(peer), pid_(pid) {}
  void read(std::uint64_t remote, void* local, std::size_t bytes,
            const std::string& operation) const override;
  void write(std::uint64_t remote, const void* local, std::size_t bytes,
             const std::string& operation) const override;
  std::shared_ptr<char> map(int fd, std::size_t bytes, std::string* why) const override;

 private:
  void copy(bool to_peer, char* local, std::uint64_t remote, std::size_t bytes,
            const std::string& operation) const;
  int rank_;
  int peer_;
  int pid_;
};

}  // namespace anview::transport
