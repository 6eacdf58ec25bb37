// Memory for large messages, as MPI_Alloc_mem and ncclMemAlloc give: page-aligned, zeroed,
// and backed by 2 MiB transparent huge pages where the kernel allows them.
//
//   anview::HostBuffer out(64 << 20), in(64 << 20);  // both sides: see below
//   comm.send(out.data(), out.size(), 1, tag);       // rank 1 receives into its own HostBuffer
//
// Every Anview call takes plain memory too; this is about speed. A same-host transfer of a
// large message is one copy by cross-memory attach: the kernel pins the other process's pages
// one by one and copies through this process's page tables. With 2 MiB pages on both sides
// there are 512 times fewer pages to pin and to miss in the TLB, and a 16 MiB message moves
// about twice as fast as between malloc'd buffers (README, Performance); a HostBuffer on one
// side only gains little. Recent PyTorch releases can give CPU tensors of 2 MiB and more the
// same pages (C10_THP_MEM_ALLOC_ENABLE=1, earlier THP_MEM_ALLOC_ENABLE=1; Debian 12's PyTorch
// 1.13 has neither); from Python, numpy.frombuffer(anview.HostBuffer(n), dtype) views one.
// Without code changes, GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (glibc 2.35+) has malloc ask
// for them everywhere in the process.
//
// Each buffer takes whole 2 MiB pages: meant for buffers of a megabyte and more, not for many
// small ones. Where the kernel's policy is "never" (huge_page_policy()), or a 2 MiB page is
// not free when a page is first touched, the buffer is plain pages and works the same.
#pragma once

#include <cstddef>
#include <string>

namespace anview {

class HostBuffer {
 public:
  HostBuffer() = default;
  // `bytes` zeroed bytes (none: an empty buffer with a null data()). Raises Error(internal)
  // when the kernel refuses the mapping (with overcommit, memory that runs out later ends the
  // process at first touch instead, as for malloc), Error(usage) for a size past the address
  // space.
  explicit HostBuffer(std::size_t bytes);
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer();

  void* data() const { return data_; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // The kernel was asked for 2 MiB pages for this buffer and its policy allows them. (Kernels
  // with per-size settings, /sys/kernel/mm/transparent_hugepage/hugepages-2048kB/enabled, may
  // still refuse them there.)
  bool huge_pages() const { return huge_pages_; }

  // The kernel's transparent huge page policy for such memory, as
  // /sys/kernel/mm/transparent_hugepage/enabled says: "always", "madvise" (HostBuffer gets
  // them, plain malloc does not), "never", or "unavailable" (the file cannot be read: a kernel
  // without them, or /sys hidden in a container, where huge_pages() then says false although
  // the pages may be huge).
  static std::string huge_page_policy();

 private:
  void release() noexcept;

  void* data_ = nullptr;
  std::size_t size_ = 0;
  bool huge_pages_ = false;
};

}  // namespace anview
