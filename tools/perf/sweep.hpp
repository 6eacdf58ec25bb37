// The message sizes one anview-perf sweep measures, and how anview-perf writes a size.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace perf {

// first, first * factor, ... while at most last; each size at least one more than the one
// before (0 is followed by 1).
std::vector<std::size_t> sweep_sizes(std::size_t first, std::size_t last, double factor);

// In the largest binary unit that divides it: 1024 -> "1 KiB", 1000 -> "1000 B".
std::string human_size(std::size_t bytes);

}  // namespace perf
