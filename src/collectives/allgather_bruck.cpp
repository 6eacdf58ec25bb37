// Allgather of uniform blocks in ceil(log2 n) steps (Bruck et al.), where the ring takes n-1:
// latency-bound blocks on many ranks. At the step of distance d (1, 2, 4, ...) each rank sends
// the blocks it has (at most n-d) to rank - d and receives as many from rank + d, so what it
// holds doubles every step.
#include <algorithm>
#include <cstddef>
#include <cstring>

#include "collectives/algorithms.hpp"
#include "collectives/steps.hpp"

namespace anview::collectives {

void allgather_bruck(Call& call, void* data, std::size_t block) {
  const int n = call.size;
  const int r = call.rank;
  auto* base = static_cast<char*>(data);
  const auto before = static_cast<std::size_t>(r) * block;  // the blocks of ranks 0 to r-1
  const std::size_t all = static_cast<std::size_t>(n) * block;
  // The steps work in a copy rotated by this rank: block i there is rank r+i's. What a rank
  // sends (its first blocks) and what it receives (the next ones) are then one run each.
  char* rotated = call.scratch_bytes(all);
  if (block > 0) std::memcpy(rotated, base + before, block);
  for (int d = 1; d < n; d *= 2) {
    const std::size_t run = static_cast<std::size_t>(std::min(d, n - d)) * block;
    sendrecv(call, rotated, run, mod(r - d, n), rotated + static_cast<std::size_t>(d) * block, run,
             mod(r + d, n));
  }
  // Back to rank order: ranks r to n-1 come first in the copy, then ranks 0 to r-1.
  if (block > 0) {
    std::memcpy(base + before, rotated, all - before);
    if (before > 0) std::memcpy(base, rotated + (all - before), before);
  }
}

}  // namespace anview::collectives
