// Reduce-scatter by recursive halving (MPICH's MPIR_Reduce_scatter_intra_recursive_halving,
// for commutative operations, which all of Anview's are): in log2(p) steps each rank sends
// half of its window to its partner and reduces the partner's copy of the other half into its
// own, so each rank moves and reduces about the buffer once, as the ring does, but in log2(p)
// messages instead of p-1: the latency-bound sizes across hosts.
//
// Ranks that are not a power of two fold first (steps.hpp): virtual rank v then speaks for the
// blocks of the ranks behind it (2v and 2v+1 for the first `extra`, v + extra after), which
// are consecutive, so every window of virtual ranks is one run of blocks. The halving goes
// from the highest bit down, which leaves each virtual rank with its own blocks; the odd rank
// of a folded pair hands its partner's block back at the end.
#include <cstddef>

#include "collectives/algorithms.hpp"
#include "collectives/reduce.hpp"
#include "collectives/steps.hpp"

namespace anview::collectives {

void reduce_scatter_recursive_halving(Call& call, const void* send_data, void* work,
                                      std::size_t count, DataType type, ReduceOp op) {
  const std::size_t block = count * size_of(type);
  const auto blocks = static_cast<std::size_t>(call.size);
  auto* base = static_cast<char*>(work);
  // This rank's values so far: `send` until it reduced anything into `work`.
  const auto* own = static_cast<const char*>(send_data);
  char* incoming = call.scratch_bytes(blocks * block);  // the fold brings the whole buffer
  const PowerOfTwo p = fold_to_power_of_two(call, own, base, blocks * count, type, op, incoming);
  if (call.rank < 2 * p.extra) own = base;
  // The first block virtual rank v speaks for; first_block(pof2) is the end of the buffer.
  auto first_block = [&](int v) {
    return static_cast<std::size_t>(v < p.extra ? 2 * v : v + p.extra);
  };
  if (p.vrank >= 0) {
    int first = 0;  // the window [first, first + 2 * mask) of virtual ranks this rank works on
    for (int mask = p.pof2 / 2; mask > 0; mask >>= 1) {
      const int partner_v = p.vrank ^ mask;
      const bool lower = (p.vrank & mask) == 0;
      const int keep = lower ? first : first + mask;
      const int give = lower ? first + mask : first;
      const std::size_t keep_at = first_block(keep) * block;
      const std::size_t keep_bytes = first_block(keep + mask) * block - keep_at;
      const std::size_t give_at = first_block(give) * block;
      const std::size_t give_bytes = first_block(give + mask) * block - give_at;
      sendrecv(call, own + give_at, give_bytes, p.rank(partner_v), incoming, keep_bytes,
               p.rank(partner_v));
      reduce_to(base + keep_at, own + keep_at, incoming, keep_bytes / size_of(type), type, op);
      own = base;  // the next window lies in `keep`, now in `work`
      first = keep;
    }
  }
  // A folded pair: the odd rank holds both blocks reduced, the even one gets its own.
  const int r = call.rank;
  if (r < 2 * p.extra) {
    const auto even = static_cast<std::size_t>(r - r % 2);
    if (r % 2 == 1)
      send(call, base + even * block, block, r - 1);
    else
      recv(call, base + even * block, block, r + 1);
  }
}

}  // namespace anview::collectives
