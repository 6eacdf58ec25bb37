#include "anview/host_buffer.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <utility>

#include "anview/error.hpp"
#include "base/huge_pages.hpp"
#include "base/socket.hpp"

namespace anview {

namespace {

constexpr std::size_t huge_page = std::size_t{2} << 20;

// The mapping behind a buffer of `bytes`: whole 2 MiB pages.
std::size_t mapped_bytes(std::size_t bytes) {
  return (bytes + huge_page - 1) / huge_page * huge_page;
}

}  // namespace

std::string HostBuffer::huge_page_policy() {
  return base::huge_page_policy();
}

HostBuffer::HostBuffer(std::size_t bytes) {
  if (bytes == 0) return;
  if (bytes > SIZE_MAX - 2 * huge_page) {
    throw Error(ErrorKind::usage,
                {.operation = "host_buffer",
                 .cause = std::to_string(bytes) + " bytes is more than the address space"});
  }
  const std::size_t mapped = mapped_bytes(bytes);
  // mmap aligns to small pages only: map one huge page more and trim both ends to the
  // boundaries, so that every 2 MiB of the buffer can be one page.
  const std::size_t reserved = mapped + huge_page;
  void* raw = ::mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    const int err = errno;  // before the strings below allocate
    throw base::sys_error(
        ErrorKind::internal, {.operation = "host_buffer"},
        "mmap() of " + std::to_string(reserved) + " bytes for a buffer of " + std::to_string(bytes),
        err);
  }
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (start + huge_page - 1) / huge_page * huge_page;
  const std::size_t head = aligned - start;
  const std::size_t tail = reserved - head - mapped;
  // Trimming cannot fail but where splitting the mapping would pass vm.max_map_count: the
  // unused ends (2 MiB together, never touched, so never backed) then stay reserved.
  if (head > 0) (void)::munmap(raw, head);
  if (tail > 0) (void)::munmap(reinterpret_cast<void*>(aligned + mapped), tail);
  data_ = reinterpret_cast<void*>(aligned);
  size_ = bytes;
  // Refused by a kernel built without transparent huge pages (EINVAL): plain pages then.
  huge_pages_ = ::madvise(data_, mapped, MADV_HUGEPAGE) == 0 &&
                base::advised_memory_gets_huge_pages(base::huge_page_policy());
}

HostBuffer::HostBuffer(HostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      huge_pages_(std::exchange(other.huge_pages_, false)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    huge_pages_ = std::exchange(other.huge_pages_, false);
  }
  return *this;
}

HostBuffer::~HostBuffer() {
  release();
}

void HostBuffer::release() noexcept {
  if (data_ != nullptr) ::munmap(data_, mapped_bytes(size_));
  data_ = nullptr;
  size_ = 0;
  huge_pages_ = false;
}

}  // namespace anview
