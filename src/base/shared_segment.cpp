#include "base/shared_segment.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <system_error>

namespace anview::base {
namespace {

[[noreturn]] void fail(const char* what) {
  throw std::system_error(errno, std::generic_category(), what);
}

}  // namespace

SharedSegment::SharedSegment(const std::string& name, std::size_t bytes) : bytes_(bytes) {
  fd_ = sealed_memfd(name.c_str(), bytes, nullptr);
  if (!fd_.valid()) fail("a sealed memfd (memfd_create, ftruncate, F_ADD_SEALS)");
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
  if (p == MAP_FAILED) fail("mmap");
  data_ = static_cast<char*>(p);
}

SharedSegment::~SharedSegment() {
  if (data_ != nullptr) ::munmap(data_, bytes_);
}

bool seal_size(int fd) {
  return ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0;
}

Fd sealed_memfd(const char* name, std::size_t bytes, std::string* why) {
  Fd fd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  const char* step = !fd.valid()                                             ? "memfd_create"
                     : ::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0 ? "ftruncate"
                     : !seal_size(fd.get()) ? "sealing its size (F_ADD_SEALS)"
                                            : nullptr;
  if (step == nullptr) return fd;
  const int err = errno;
  if (why) *why = std::string(step) + ": " + errno_text(err);
  errno = err;
  return Fd();
}

std::optional<std::uint64_t> sealed_size(int fd) {
  const int seals = ::fcntl(fd, F_GET_SEALS);
  struct stat st {};
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0 || ::fstat(fd, &st) != 0) return std::nullopt;
  return static_cast<std::uint64_t>(st.st_size);
}

std::shared_ptr<char> map_from_process(int pid, int fd, std::size_t bytes, std::string* why) {
  auto failed = [&](const char* call) {
    if (why) *why = std::string(call) + ": " + errno_text(errno);
    return nullptr;
  };
  // glibc 2.36's <sys/pidfd.h> lacks C linkage for C++; the system calls are stable.
  Fd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd.valid()) return failed("pidfd_open");
  Fd copy(static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd.get(), fd, 0)));
  if (!copy.valid()) return failed("pidfd_getfd");
  // Memory whose owner can still shrink it: a touch past the new end would be SIGBUS here.
  const auto size = sealed_size(copy.get());
  if (!size) {
    if (why)
      *why = "descriptor " + std::to_string(fd) +
             " is not memory whose size is sealed against shrinking (no longer the region's?)";
    return nullptr;
  }
  // The number may name another memfd by now (the region was freed): never map past its end.
  if (*size < bytes) {
    if (why) *why = "descriptor " + std::to_string(fd) + " is no longer the region's memory";
    return nullptr;
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, copy.get(), 0);
  if (p == MAP_FAILED) return failed("mmap");
  return std::shared_ptr<char>(static_cast<char*>(p), [bytes](char* q) { ::munmap(q, bytes); });
}

}  // namespace anview::base
