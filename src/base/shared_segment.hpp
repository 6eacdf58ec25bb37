// Memory that other processes of this host can map: a memfd, mapped here read-write. What
// Communicator::allocate_memory hands out, so that same-host peers put and get with a plain
// copy into their own mapping of it (transport::PeerMemory::map) instead of a system call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "base/socket.hpp"

namespace anview::base {

class SharedSegment {
 public:
  // Raises std::system_error when the memory cannot be had (sealed_memfd(), mmap).
  SharedSegment(const std::string& name, std::size_t bytes);
  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  char* data() const { return data_; }
  std::size_t size() const { return bytes_; }
  int fd() const { return fd_.get(); }

 private:
  Fd fd_;
  char* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// A memfd made with MFD_ALLOW_SEALING gets its size sealed (F_SEAL_SHRINK, F_SEAL_GROW, then
// F_SEAL_SEAL): no process that can open it (a peer through /proc/PID/fd or pidfd_getfd, with
// the rights cross-memory attach needs) can truncate it under a mapping, where the next touch
// past the new end would kill the mapping's process with SIGBUS. False, errno set, if it cannot.
bool seal_size(int fd);
// A new memfd of `bytes` whose size is sealed (seal_size()), for memory other processes map;
// invalid, with `why` naming the step that failed, where it cannot be had.
Fd sealed_memfd(const char* name, std::size_t bytes, std::string* why);
// `fd`'s size, if it is sealed against shrinking: only then is a mapping of memory another
// process made safe from that process (up to that size). Checked before the size is read, so
// the size cannot fall below it afterwards.
std::optional<std::uint64_t> sealed_size(int fd);

// Maps `bytes` of file descriptor `fd` of process `pid` (pidfd_getfd: the same permission as
// cross-memory attach) read-write into this process; null with `why` set when it cannot (among
// others: its size is not sealed).
// The mapping stays valid after the other process closes or exits; the pointer unmaps it.
std::shared_ptr<char> map_from_process(int pid, int fd, std::size_t bytes, std::string* why);

}  // namespace anview::base
