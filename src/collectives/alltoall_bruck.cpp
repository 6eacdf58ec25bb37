// Bruck's alltoall (Bruck et al. 1997; Thakur, Rabenseifner and Gropp 2005): ceil(log2 p)
// rounds instead of pairwise exchange's p - 1, each carrying about half of the blocks, so small
// blocks pay log2(p) latencies. The blocks are rotated so that position i holds the block for
// rank r + i; round k sends every block whose position has bit k to rank r + k (and takes the
// same positions from rank r - k); at the end position i holds the block from rank r - i.
#include <cstring>

#include "collectives/algorithms.hpp"
#include "collectives/steps.hpp"

namespace anview::collectives {

void alltoall_bruck(Call& call, const void* send, void* recv, std::size_t block) {
  const int n = call.size;
  const int r = call.rank;
  const auto un = static_cast<std::size_t>(n);
  const std::size_t half = (un + 1) / 2;  // the most blocks one round carries
  char* rotated = call.scratch_bytes(un * block + 2 * half * block);
  char* out = rotated + un * block;
  char* in = out + half * block;
  const auto* from = static_cast<const char*>(send);
  auto* to = static_cast<char*>(recv);
  auto at = [&](char* base, int i) { return base + static_cast<std::size_t>(i) * block; };
  if (block > 0) {
    for (int i = 0; i < n; ++i) std::memcpy(at(rotated, i), from + mod(r + i, n) * block, block);
  }
  for (int k = 1; k < n; k <<= 1) {
    std::size_t m = 0;
    for (int i = k; i < n; ++i) {
      if ((i & k) == 0) continue;
      if (block > 0) std::memcpy(at(out, static_cast<int>(m)), at(rotated, i), block);
      ++m;
    }
    sendrecv(call, out, m * block, mod(r + k, n), in, m * block, mod(r - k, n));
    if (block == 0) continue;
    m = 0;
    for (int i = k; i < n; ++i) {
      if ((i & k) == 0) continue;
      std::memcpy(at(rotated, i), at(in, static_cast<int>(m++)), block);
    }
  }
  if (block > 0) {
    for (int i = 0; i < n; ++i) std::memcpy(to + mod(r - i, n) * block, at(rotated, i), block);
  }
}

}  // namespace anview::collectives
