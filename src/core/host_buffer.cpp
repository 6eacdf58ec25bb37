#include "anview/host_buffer.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <utility>

#include "anview/error.hpp"

namespace anview {

namespace {

constexpr std::size_t huge_page = std::size_t{2} << 20;

Error no_memory(std::size_t bytes, int error) {
  return Error(ErrorKind::internal,
               {.operation = "HostBuffer",
                .cause = "mmap of " + std::to_string(bytes) + " bytes: " + std::strerror(error)});
}

}  // namespace

std::string HostBuffer::huge_page_policy() {
  // "always [madvise] never": the bracketed word is the policy.
  std::ifstream file("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!file || !std::getline(file, line)) return "unavailable";
  const auto open = line.find('[');
  const auto close = line.find(']', open);
  if (open == std::string::npos || close == std::string::npos) return "unavailable";
  return line.substr(open + 1, close - open - 1);
}

HostBuffer::HostBuffer(std::size_t bytes) {
  if (bytes == 0) return;
  if (bytes > SIZE_MAX - 2 * huge_page) throw no_memory(bytes, ENOMEM);
  const std::size_t mapped = (bytes + huge_page - 1) / huge_page * huge_page;
  // mmap aligns to small pages only: map one huge page more and trim both ends to the
  // boundaries, so that every 2 MiB of the buffer can be one page.
  const std::size_t reserved = mapped + huge_page;
  void* raw = ::mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw no_memory(bytes, errno);
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (start + huge_page - 1) / huge_page * huge_page;
  const std::size_t head = aligned - start;
  const std::size_t tail = reserved - head - mapped;
  if (head > 0) ::munmap(raw, head);
  if (tail > 0) ::munmap(reinterpret_cast<void*>(aligned + mapped), tail);
  data_ = reinterpret_cast<void*>(aligned);
  size_ = bytes;
  mapped_ = mapped;
  // Refused by a kernel built without transparent huge pages (EINVAL): plain pages then.
  const std::string policy = huge_page_policy();
  huge_pages_ =
      ::madvise(data_, mapped_, MADV_HUGEPAGE) == 0 && (policy == "always" || policy == "madvise");
}

HostBuffer::HostBuffer(HostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)),
      huge_pages_(std::exchange(other.huge_pages_, false)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    huge_pages_ = std::exchange(other.huge_pages_, false);
  }
  return *this;
}

HostBuffer::~HostBuffer() {
  release();
}

void HostBuffer::release() noexcept {
  if (data_ != nullptr) ::munmap(data_, mapped_);
  data_ = nullptr;
  size_ = 0;
  mapped_ = 0;
  huge_pages_ = false;
}

}  // namespace anview
