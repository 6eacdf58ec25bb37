#include "transport/cross_memory.hpp"

#include <sys/uio.h>

#include <cerrno>

#include "base/log.hpp"
#include "base/shared_segment.hpp"
#include "base/socket.hpp"

namespace anview::transport {

int copy_cross_memory(int pid, bool to_peer, char* local, std::uint64_t remote, std::size_t bytes) {
  std::size_t done = 0;
  while (done < bytes) {
    iovec here{local + done, bytes - done};
    iovec there{reinterpret_cast<void*>(remote + done), bytes - done};
    const ssize_t n = to_peer ? ::process_vm_writev(pid, &here, 1, &there, 1, 0)
                              : ::process_vm_readv(pid, &here, 1, &there, 1, 0);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 ? errno : EIO;
  }
  return 0;
}

ErrorKind cross_memory_error_kind(int err) {
  return err == ESRCH    ? ErrorKind::peer_lost
         : err == EFAULT ? ErrorKind::protocol
                         : ErrorKind::link;
}

std::string cross_memory_cause(int err, bool to_peer, int rank, int pid, std::size_t bytes) {
  const std::string who = "rank " + std::to_string(rank);
  if (err == ESRCH) {
    return "the process of " + who + " (pid " + std::to_string(pid) + ") ended while we " +
           (to_peer ? "wrote into" : "read from") + " its memory";
  }
  return std::string(to_peer ? "writing " : "reading ") + std::to_string(bytes) + " bytes " +
         (to_peer ? "into " : "from ") + who +
         "'s memory failed: " + (to_peer ? "process_vm_writev: " : "process_vm_readv: ") +
         base::errno_text(err) + (err == EFAULT ? " (an invalid buffer was offered)" : "");
}

void CrossMemoryAccess::read(std::uint64_t remote, void* local, std::size_t bytes,
                             const std::string& operation) const {
  copy(false, static_cast<char*>(local), remote, bytes, operation);
}

void CrossMemoryAccess::write(std::uint64_t remote, const void* local, std::size_t bytes,
                              const std::string& operation) const {
  // process_vm_writev only reads from `local`.
  copy(true, const_cast<char*>(static_cast<const char*>(local)), remote, bytes, operation);
}

std::shared_ptr<char> CrossMemoryAccess::map(int fd, std::size_t bytes, std::string* why) const {
  return base::map_from_process(pid_, fd, bytes, why);
}

void CrossMemoryAccess::copy(bool to_peer, char* local, std::uint64_t remote, std::size_t bytes,
                             const std::string& operation) const {
  const int err = copy_cross_memory(pid_, to_peer, local, remote, bytes);
  if (err == 0) return;
  Error error(cross_memory_error_kind(err),
              ErrorContext{.rank = rank_,
                           .peer = peer_,
                           .peer_address = "shm",
                           .operation = operation,
                           .cause = cross_memory_cause(err, to_peer, peer_, pid_, bytes)});
  // A peer whose process is gone is logged once, by the link that fails with it: the caller
  // fails it (one-sided operations), or the exit watch finds the death. Logged here as well,
  // every put or get to a killed rank wrote the same line twice.
  if (error.kind() != ErrorKind::peer_lost) base::log("shm", base::LogLevel::error, error.what());
  throw error;
}

bool probe_cross_memory_attach(int pid, std::uint64_t address, std::string* why) {
  std::uint64_t value = 0;
  iovec local{&value, sizeof value};
  iovec remote{reinterpret_cast<void*>(address), sizeof value};
  const ssize_t n = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
  if (n == static_cast<ssize_t>(sizeof value) && value == probe_value) return true;
  if (why) {
    if (n < 0 && (errno == EPERM || errno == EACCES)) {
      *why = "cross-memory attach refused (" + base::errno_text(errno) +
             "): ptrace is restricted here (kernel.yama.ptrace_scope, a container's seccomp "
             "profile or missing CAP_SYS_PTRACE)";
    } else if (n < 0) {
      *why = "cross-memory attach failed: process_vm_readv: " + base::errno_text(errno);
    } else {
      *why = "cross-memory attach read the wrong bytes (not the same process?)";
    }
  }
  return false;
}

}  // namespace anview::transport
