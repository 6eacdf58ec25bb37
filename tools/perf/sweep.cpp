#include "sweep.hpp"

#include <algorithm>

namespace perf {

std::vector<std::size_t> sweep_sizes(std::size_t first, std::size_t last, double factor) {
  std::vector<std::size_t> sizes;
  for (std::size_t bytes = first; bytes <= last;) {
    sizes.push_back(bytes);
    if (bytes == 0) {
      bytes = 1;
      continue;
    }
    const double next = static_cast<double>(bytes) * factor;
    if (next > static_cast<double>(last)) break;
    bytes = std::max(static_cast<std::size_t>(next), bytes + 1);
  }
  return sizes;
}

std::string human_size(std::size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  std::size_t v = bytes;
  while (u < 3 && v >= 1024 && v % 1024 == 0) {
    v /= 1024;
    ++u;
  }
  return std::to_string(v) + " " + units[u];
}

}  // namespace perf
