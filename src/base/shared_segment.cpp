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

SharedSegment::SharedSegment(const std::string& name, std::size_t bytes)
    : fd_(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING)), bytes_(bytes) {
  if (!fd_.valid()) fail("memfd_create");
  if (::ftruncate(fd_.get(), static_cast<off_t>(bytes)) != 0) fail("ftruncate");
  if (!seal_size(fd_.get())) fail("fcntl(F_ADD_SEALS)");
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

bool size_is_sealed(int fd) {
  const int seals = ::fcntl(fd, F_GET_SEALS);
  return seals >= 0 && (seals & F_SEAL_SHRINK) != 0;
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
  // Checked before the size: sealed first, its size can no longer fall below what fstat says.
  if (!size_is_sealed(copy.get())) {
    if (why)
      *why = "descriptor " + std::to_string(fd) +
             " is not memory whose size is sealed against shrinking (no longer the region's?)";
    return nullptr;
  }
  // The number may name another file by now (the region was freed): never map past its end.
  struct stat st {};
  if (::fstat(copy.get(), &st) != 0) return failed("fstat");
  if (!S_ISREG(st.st_mode) || static_cast<std::uint64_t>(st.st_size) < bytes) {
    if (why) *why = "descriptor " + std::to_string(fd) + " is no longer the region's memory";
    return nullptr;
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, copy.get(), 0);
  if (p == MAP_FAILED) return failed("mmap");
  return std::shared_ptr<char>(static_cast<char*>(p), [bytes](char* q) { ::munmap(q, bytes); });
}

}  // namespace anview::base
