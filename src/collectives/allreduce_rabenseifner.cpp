// Allreduce as a reduce-scatter by recursive halving then an allgather by recursive doubling
// (Rabenseifner's algorithm; MPICH's MPIR_Allreduce_intra_reduce_scatter_allgather). Each rank
// moves and reduces about twice the buffer in all, where recursive doubling moves it log2(n)
// times, and in 2 log2(n) steps, where the ring takes 2(n-1): large buffers on many ranks.
#include <cstddef>
#include <cstring>

#include "collectives/algorithms.hpp"
#include "collectives/reduce.hpp"
#include "collectives/steps.hpp"

namespace anview::collectives {
namespace {

// Segments [first, last) of `count` elements cut into `parts`, as one run of elements.
Segment segments(std::size_t count, int parts, int first, int last) {
  const std::size_t begin = segment(count, parts, first).offset;
  return {begin, segment(count, parts, last).offset - begin};
}

}  // namespace

void allreduce_rabenseifner(Call& call, const void* send, void* recv, std::size_t count,
                            DataType type, ReduceOp op) {
  const std::size_t esize = size_of(type);
  auto* base = static_cast<char*>(recv);
  // This rank's values so far: its contribution (the send buffer, not copied into `recv`
  // first), then, once it reduced anything, `recv`.
  const auto* own = static_cast<const char*>(send);
  // The fold of the extra ranks brings the whole buffer.
  char* incoming = call.scratch_bytes(count * esize);
  const PowerOfTwo p = fold_to_power_of_two(call, own, base, count, type, op, incoming);
  if (call.rank < 2 * p.extra) own = base;  // folded (the ones that sat out get `recv` back)
  if (p.vrank >= 0) {
    // The window [first, last) of the pof2 segments this rank works on. Partners at each step
    // share a window (it depends only on the bits of their vranks already used), so they cut
    // it the same way.
    int first = 0, last = p.pof2;
    // Reduce-scatter: each step halves the window; the lower vrank keeps the lower half, sends
    // the other half to its partner and reduces the partner's copy of its own half into it.
    // In the end each rank holds one segment reduced by it alone; the allgather only copies,
    // so every rank ends with the owner's bits.
    for (int mask = 1; mask < p.pof2; mask <<= 1) {
      const int vpartner = p.vrank ^ mask;
      const int partner = p.rank(vpartner);
      const int middle = first + (last - first) / 2;
      const bool lower = p.vrank < vpartner;
      const Segment keep = segments(count, p.pof2, lower ? first : middle, lower ? middle : last);
      const Segment give = segments(count, p.pof2, lower ? middle : first, lower ? last : middle);
      // One message each way (the window of the next step lies in `keep`, which this step
      // writes into `recv`). Cut into ANVIEW_COLL_CHUNK pieces, a 16 MiB call over TCP took
      // 7.7 instead of 6.9 ms (a rendezvous per 256 KiB piece; TCP pipelines the one message
      // itself), and the cost model prices it unchunked.
      exchange_reduce(call, own + give.offset * esize, give.count, partner,
                      own + keep.offset * esize, base + keep.offset * esize, keep.count, partner,
                      type, op, count * esize);
      own = base;
      (lower ? last : first) = middle;
    }
    // A single rank (hierarchical's one leader) reduced nothing.
    if (own != base && count > 0) std::memcpy(base, own, count * esize);
    // Allgather: the same partners in reverse order. Their windows are the two halves of the
    // one they shared at that step of the reduce-scatter; each sends its own and receives the
    // other's in place, and the window doubles back to the whole buffer.
    for (int mask = p.pof2 / 2; mask > 0; mask >>= 1) {
      const int vpartner = p.vrank ^ mask;
      const int partner = p.rank(vpartner);
      const int width = last - first;
      const int other = p.vrank < vpartner ? last : first - width;
      const Segment mine = segments(count, p.pof2, first, last);
      const Segment theirs = segments(count, p.pof2, other, other + width);
      sendrecv(call, base + mine.offset * esize, mine.count * esize, partner,
               base + theirs.offset * esize, theirs.count * esize, partner);
      if (other < first) first = other;
      last = first + 2 * width;
    }
  }
  unfold_from_power_of_two(call, p, base, count * esize);
}

}  // namespace anview::collectives
