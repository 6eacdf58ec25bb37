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
  Buffer(std::size_t count, bool huge_pages) : count_(count) {
    if (huge_pages) {
      host_ = anview::HostBuffer(count * sizeof(T));
      data_ = static_cast<T*>(host_.data());
    } else {
      plain_.resize(count);
      data_ = plain_.data();
    }
  }

  // (Moving either owner keeps its memory where it is: data_ stays valid.)
  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return count_; }
  T* begin() { return data_; }
  T* end() { return data_ + count_; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }

 private:
  anview::HostBuffer host_;
  std::vector<T> plain_;
  T* data_ = nullptr;
  std::size_t count_;
};

}  // namespace perf
