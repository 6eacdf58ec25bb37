// A payload buffer of anview-perf: heap memory, as the peers' benchmarks use, or with
// --huge-pages an anview::HostBuffer (2 MiB pages where the kernel allows them).
#pragma once

#include <cstddef>
#include <vector>

#include "anview/host_buffer.hpp"

namespace perf {

template <typename T>
class Buffer {
 public:
  Buffer(std::size_t count, bool huge_pages) : huge_pages_(huge_pages), count_(count) {
    if (huge_pages_)
      host_ = anview::HostBuffer(count * sizeof(T));
    else
      plain_.resize(count);
  }

  T* data() { return huge_pages_ ? static_cast<T*>(host_.data()) : plain_.data(); }
  const T* data() const {
    return huge_pages_ ? static_cast<const T*>(host_.data()) : plain_.data();
  }
  std::size_t size() const { return count_; }
  T* begin() { return data(); }
  T* end() { return data() + count_; }
  T& operator[](std::size_t i) { return data()[i]; }
  const T& operator[](std::size_t i) const { return data()[i]; }

 private:
  bool huge_pages_;
  std::size_t count_;
  anview::HostBuffer host_;
  std::vector<T> plain_;
};

}  // namespace perf
