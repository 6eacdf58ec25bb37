// The steps every collective algorithm is made of: posting a message of the call, waiting for
// it (with the call's timeout, giving up early when any rank of the communicator is gone), and
// cutting a buffer into per-rank segments.
#pragma once

#include <cstddef>

#include "collectives/algorithms.hpp"

namespace anview::collectives {

using p2p::RequestPtr;

// Failures name the collective call they broke (with the p2p cause, peer and kind).
[[noreturn]] void rethrow(const Call& call, const Error& e);

// Waits for one step. A collective needs every rank: when any rank's link fails (a rank died,
// a link broke), the call fails with that cause even if this step waits for another, live
// rank (which is itself stuck behind the dead one) -- no survivor hangs until its timeout.
void wait(Call& call, const RequestPtr& request);

RequestPtr post_recv(Call& call, void* data, std::size_t bytes, int from);
RequestPtr post_send(Call& call, const void* data, std::size_t bytes, int to);
void send(Call& call, const void* data, std::size_t bytes, int to);
// A message of another size than this rank expects means the ranks disagree about the call.
void check_size(const Call& call, const RequestPtr& r, std::size_t bytes, int from);
void recv(Call& call, void* data, std::size_t bytes, int from);
// Sends to one rank and receives from another at once (both posted before either waits).
void sendrecv(Call& call, const void* sdata, std::size_t sbytes, int to, void* rdata,
              std::size_t rbytes, int from);
// Sends `scount` elements of `source` to `to` while receiving `rcount` from `from`, and sets
// target[i] = own[i] (op) received[i] (`own` may be `target`: out-of-place callers reduce
// straight from the user's send buffer instead of copying it first; `target` may overlap
// `source`, the reduction then waits for the sends). Cut into chunks of `chunk_bytes`: the
// reduction of one chunk overlaps the transfer of the next.
void exchange_reduce(Call& call, const char* source, std::size_t scount, int to, const char* own,
                     char* target, std::size_t rcount, int from, DataType type, ReduceOp op,
                     std::size_t chunk_bytes);

// Segment i of `count` elements cut into `parts` nearly equal pieces.
struct Segment {
  std::size_t offset;
  std::size_t count;
};
Segment segment(std::size_t count, int parts, int i);

inline int mod(int a, int n) {
  return ((a % n) + n) % n;
}

// Recursive doubling and halving pair ranks up by the bits of their number, which needs a power
// of two of them. The others (MPICH's scheme): the first 2*extra ranks pair up, the even one of
// each pair hands its data to the odd one and sits out; the pof2 ranks left are numbered 0 to
// pof2-1 (their vrank) and run the algorithm; the ones that sat out get the result at the end.
struct PowerOfTwo {
  int pof2;
  int extra;
  int vrank;  // -1 where this rank sits out
  // The rank behind a vrank.
  int rank(int v) const { return v < extra ? v * 2 + 1 : v + extra; }
};
// Folds the extra ranks' `count` elements into their partners' (`incoming`: room for them).
// `own` holds this rank's elements, `data` gets the fold (they may be the same buffer); a rank
// that folds or sits out leaves `data` unwritten.
PowerOfTwo fold_to_power_of_two(Call& call, const void* own, void* data, std::size_t count,
                                DataType type, ReduceOp op, char* incoming);
// Hands the result (`bytes` of `data`) back to the ranks that sat out.
void unfold_from_power_of_two(Call& call, const PowerOfTwo& p, void* data, std::size_t bytes);

}  // namespace anview::collectives
