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

// Segment i of `count` elements cut into `parts` nearly equal pieces.
struct Segment {
  std::size_t offset;
  std::size_t count;
};
Segment segment(std::size_t count, int parts, int i);

inline int mod(int a, int n) {
  return ((a % n) + n) % n;
}

}  // namespace anview::collectives
