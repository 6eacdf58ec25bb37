#include "collectives/algorithms.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/reduce.hpp"
#include "collectives/steps.hpp"

namespace anview::collectives {

void allreduce_ring(Call& call, const void* send, void* recv, std::size_t count, DataType type,
                    ReduceOp op) {
  const int n = call.size;
  const int r = call.rank;
  const std::size_t esize = size_of(type);
  const auto* own = static_cast<const char*>(send);
  auto* bytes = static_cast<char*>(recv);
  const int right = mod(r + 1, n);
  const int left = mod(r - 1, n);
  // Reduce-scatter: after n-1 steps this rank holds the full reduction of segment r. Each step
  // reduces a segment this rank has not touched yet, from its own contribution (`own`, the
  // send buffer) into `recv`; the first step sends a segment straight from `own`, the later
  // ones the segment the step before reduced. So `recv` needs no copy of `send` first: every
  // segment of it is written, by this reduce-scatter or by the allgather below.
  for (int s = 0; s < n - 1; ++s) {
    const Segment out = segment(count, n, mod(r - s - 1, n));
    const Segment in = segment(count, n, mod(r - s - 2, n));
    const char* from = s == 0 ? own : bytes;
    exchange_reduce(call, from + out.offset * esize, out.count, right, own + in.offset * esize,
                    bytes + in.offset * esize, in.count, left, type, op, call.chunk_bytes);
  }
  // Allgather: pass the reduced segments around the ring.
  for (int s = 0; s < n - 1; ++s) {
    const Segment out = segment(count, n, mod(r - s, n));
    const Segment in = segment(count, n, mod(r - s - 1, n));
    sendrecv(call, bytes + out.offset * esize, out.count * esize, right, bytes + in.offset * esize,
             in.count * esize, left);
  }
}

void allreduce_recursive_doubling(Call& call, void* data, std::size_t count, DataType type,
                                  ReduceOp op) {
  const std::size_t bytes = count * size_of(type);
  char* incoming = call.scratch_bytes(bytes);
  const PowerOfTwo p = fold_to_power_of_two(call, data, data, count, type, op, incoming);
  if (p.vrank >= 0) {
    for (int mask = 1; mask < p.pof2; mask <<= 1) {
      const int partner = p.rank(p.vrank ^ mask);
      sendrecv(call, data, bytes, partner, incoming, bytes, partner);
      // Both partners combine the same two operands: every rank ends with identical bits.
      reduce_into(data, incoming, count, type, op);
    }
  }
  unfold_from_power_of_two(call, p, data, bytes);
}

void broadcast_binomial(Call& call, void* data, std::size_t bytes, int root) {
  const int n = call.size;
  const int vr = mod(call.rank - root, n);
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      recv(call, data, bytes, mod(vr - mask + root, n));
      break;
    }
    mask <<= 1;
  }
  std::vector<RequestPtr> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vr + mask < n) sends.push_back(post_send(call, data, bytes, mod(vr + mask + root, n)));
  }
  for (auto& s : sends) wait(call, s);
}

void reduce_binomial(Call& call, const void* send_data, void* work, std::size_t count,
                     DataType type, ReduceOp op, int root) {
  const int n = call.size;
  const int vr = mod(call.rank - root, n);
  const std::size_t bytes = count * size_of(type);
  char* incoming = call.scratch_bytes(bytes);
  // This rank's values so far: its contribution until it reduced a child's into `work`.
  const void* own = send_data;
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vr & mask) {
      send(call, own, bytes, mod(vr - mask + root, n));
      return;
    }
    if (vr + mask < n) {
      recv(call, incoming, bytes, mod(vr + mask + root, n));
      reduce_to(work, own, incoming, count, type, op);
      own = work;
    }
  }
  if (own != work && bytes > 0) std::memcpy(work, own, bytes);  // a root without children
}

Blocks Blocks::uniform(int ranks, std::size_t block) {
  Blocks b;
  b.offset.resize(static_cast<std::size_t>(ranks));
  b.bytes.assign(static_cast<std::size_t>(ranks), block);
  for (std::size_t r = 0; r < b.offset.size(); ++r) b.offset[r] = r * block;
  return b;
}

void allgather_ring(Call& call, void* data, const Blocks& blocks) {
  const int n = call.size;
  const int r = call.rank;
  for (int s = 0; s < n - 1; ++s) {
    const int out = mod(r - s, n);
    const int in = mod(r - s - 1, n);
    sendrecv(call, blocks.at(data, out), blocks.size(out), mod(r + 1, n), blocks.at(data, in),
             blocks.size(in), mod(r - 1, n));
  }
}

void reduce_scatter_ring(Call& call, const void* send, void* work, void* recv, std::size_t count,
                         DataType type, ReduceOp op) {
  const int n = call.size;
  const int r = call.rank;
  const std::size_t block = count * size_of(type);
  const auto* own = static_cast<const char*>(send);
  auto* partial = static_cast<char*>(work);
  // Step s reduces block r-s-2 from `send` and what came from the left into `work`, and sends
  // the block the step before reduced there (the first step sends from `send`); the last step's
  // block is this rank's own, reduced straight into `recv`.
  for (int s = 0; s < n - 1; ++s) {
    const auto out = static_cast<std::size_t>(mod(r - s - 1, n));
    const auto in = static_cast<std::size_t>(mod(r - s - 2, n));
    const char* from = s == 0 ? own : partial;
    char* target = s == n - 2 ? static_cast<char*>(recv) : partial + in * block;
    exchange_reduce(call, from + out * block, count, mod(r + 1, n), own + in * block, target, count,
                    mod(r - 1, n), type, op, call.chunk_bytes);
  }
}

void alltoall_pairwise(Call& call, const void* send, const Blocks& sblocks, void* recv,
                       const Blocks& rblocks) {
  const int n = call.size;
  const int r = call.rank;
  if (rblocks.size(r) != sblocks.size(r)) {
    throw Error(ErrorKind::usage,
                {.rank = r,
                 .operation = call.operation(),
                 .cause = "this rank sends itself " + std::to_string(sblocks.size(r)) +
                          " bytes but expects " + std::to_string(rblocks.size(r))});
  }
  if (sblocks.size(r) > 0) std::memcpy(rblocks.at(recv, r), sblocks.at(send, r), sblocks.size(r));
  // Step s: send to r+s, receive from r-s; every pair meets exactly once.
  for (int s = 1; s < n; ++s) {
    const int to = mod(r + s, n);
    const int from = mod(r - s, n);
    sendrecv(call, sblocks.at(send, to), sblocks.size(to), to, rblocks.at(recv, from),
             rblocks.size(from), from);
  }
}

void gather_linear(Call& call, const void* send_data, std::size_t send_bytes, void* recv_data,
                   const Blocks& rblocks, int root) {
  if (call.rank != root) {
    send(call, send_data, send_bytes, root);
    return;
  }
  // The root's own block first: a receive may land where its send buffer is (in place with
  // the same pointer for both, at a root other than 0, block 0 is the contribution). Already
  // in place when the root's block is its send buffer (hierarchical allgather).
  if (send_bytes > 0 && rblocks.at(recv_data, root) != send_data)
    std::memmove(rblocks.at(recv_data, root), send_data, send_bytes);
  std::vector<std::pair<RequestPtr, int>> recvs;
  for (int p = 0; p < call.size; ++p) {
    if (p == root) continue;
    recvs.emplace_back(post_recv(call, rblocks.at(recv_data, p), rblocks.size(p), p), p);
  }
  for (auto& [r, p] : recvs) {
    wait(call, r);
    check_size(call, r, rblocks.size(p), p);
  }
}

void scatter_linear(Call& call, const void* send_data, const Blocks& sblocks, void* recv_data,
                    std::size_t recv_bytes, int root) {
  if (call.rank != root) {
    recv(call, recv_data, recv_bytes, root);
    return;
  }
  std::vector<RequestPtr> sends;
  for (int p = 0; p < call.size; ++p) {
    if (p == root) continue;
    sends.push_back(post_send(call, sblocks.at(send_data, p), sblocks.size(p), p));
  }
  // The root's own block last, once the sends are done with theirs: in place with the same
  // pointer for both, at a root other than 0, it goes over block 0, which may still be read.
  for (auto& s : sends) wait(call, s);
  const char* own = sblocks.at(send_data, root);
  if (recv_bytes > 0 && own != recv_data) std::memmove(recv_data, own, recv_bytes);
}

void barrier_dissemination(Call& call) {
  const int n = call.size;
  char token = 0, got = 0;
  for (int k = 1; k < n; k <<= 1)
    sendrecv(call, &token, 0, mod(call.rank + k, n), &got, 0, mod(call.rank - k, n));
}

}  // namespace anview::collectives
