// Collective algorithms, written against p2p only (../shared/ARCHITECTURE.md). Every rank of
// the communicator calls the same collectives in the same order; each call gets its own
// reserved tag, so its messages never mix with user messages or with another call's.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "anview/collectives.hpp"
#include "anview/types.hpp"
#include "collectives/flight_recorder.hpp"
#include "collectives/watchdog.hpp"
#include "p2p/messenger.hpp"

namespace anview::collectives {

// One collective call: who we are, its tag, its deadline per step, and its name for errors.
// The buffers it needs come from the owning Collectives and are reused call after call, so a
// small collective allocates nothing.
struct Call {
  p2p::Messenger& messenger;
  int rank;
  int size;
  Tag tag;
  std::chrono::milliseconds timeout;
  const char* name;   // "allreduce"
  std::uint64_t seq;  // this communicator's collective call number
  // Every request the call posted. When the call fails, the ones still pending are abandoned
  // (cancelled, or their link closed) before the buffers they point into go away.
  std::vector<p2p::RequestPtr>& posted;
  std::vector<char>& scratch;
  std::size_t chunk_bytes;  // pipelining unit of the ring's reduce steps
  // The hang doctor (null: none) and how long a step waits before it is told (zero: never).
  StallReporter* reporter = nullptr;
  std::chrono::milliseconds watchdog{0};

  // A subgroup's call (the steps of hierarchical algorithms): `rank` and `size` are positions
  // in `group`, which holds the communicator's ranks it addresses; null: the whole of it.
  const std::vector<int>* group = nullptr;
  // The call's flight recorder entry (inert when the recorder is off).
  Recording record;

  // The communicator's rank at position `r` of this call.
  int world(int r) const { return group != nullptr ? (*group)[static_cast<std::size_t>(r)] : r; }
  // The same call among `ranks` (communicator ranks, this one at position `index`): the same
  // tag, timeout, requests and scratch. Of a whole-communicator call only.
  Call among(const std::vector<int>& ranks, int index) const {
    Call c = *this;
    c.group = &ranks;
    c.rank = index;
    c.size = static_cast<int>(ranks.size());
    return c;
  }
  std::string operation() const { return std::string(name) + " #" + std::to_string(seq); }
  // Room for `bytes` of incoming data (valid until the next call).
  char* scratch_bytes(std::size_t bytes) {
    if (scratch.size() < bytes) scratch.resize(bytes);
    return scratch.data();
  }
};

// Abandons the call's requests still pending (cancelled, or their link closed), so that none
// uses its buffer any more. An algorithm whose buffers go before run_guarded() would do it
// (its own locals) calls this itself.
inline void abandon_pending(Call& call, const Error& error) {
  for (auto& r : call.posted)
    if (!r->done.load(std::memory_order_acquire)) call.messenger.abandon(r, error);
}

// Runs `algorithm` on `call`; if it throws, abandons the call's pending requests first.
template <typename Algorithm>
void run_guarded(Call& call, Algorithm&& algorithm) {
  try {
    algorithm();
  } catch (const Error& e) {
    call.record.failed(e.what());
    abandon_pending(call, e);
    throw;
  }
}

// Where each rank's block lies in a buffer, in bytes (the v-collectives give every rank its
// own size and place; the others use uniform()).
struct Blocks {
  std::vector<std::size_t> offset;
  std::vector<std::size_t> bytes;
  static Blocks uniform(int ranks, std::size_t block);
  char* at(void* base, int rank) const {
    return static_cast<char*>(base) + offset[static_cast<std::size_t>(rank)];
  }
  const char* at(const void* base, int rank) const {
    return static_cast<const char*>(base) + offset[static_cast<std::size_t>(rank)];
  }
  std::size_t size(int rank) const { return bytes[static_cast<std::size_t>(rank)]; }
};

// Algorithms. `data` holds `count` elements of `type`; in place unless noted.
// Out of place (`send` is this rank's contribution, `recv` gets the result) or in place
// (send == recv); neither copies the whole buffer first.
void allreduce_ring(Call& call, const void* send, void* recv, std::size_t count, DataType type,
                    ReduceOp op);
void allreduce_recursive_doubling(Call& call, void* data, std::size_t count, DataType type,
                                  ReduceOp op);
void broadcast_binomial(Call& call, void* data, std::size_t bytes, int root);
// `send` is this rank's contribution; the root's `work` ends up holding the result. A rank
// with children reduces into its `work` (room for the whole buffer; it may be `send`), a leaf
// sends `send` as it is: no rank copies its input first.
void reduce_binomial(Call& call, const void* send, void* work, std::size_t count, DataType type,
                     ReduceOp op, int root);
// `data` holds every rank's block (`blocks`); this rank's is in place on entry.
void allgather_ring(Call& call, void* data, const Blocks& blocks);
// `send` holds size * count elements; `recv` gets this rank's reduced block (count elements).
// `work` has room for size * count elements (partial sums; the send buffer is not copied).
void reduce_scatter_ring(Call& call, const void* send, void* work, void* recv, std::size_t count,
                         DataType type, ReduceOp op);
// The same in log2(p) steps, halving the window each (latency-bound sizes); on return this
// rank's reduced block is in `work` at rank * count.
void reduce_scatter_recursive_halving(Call& call, const void* send, void* work, std::size_t count,
                                      DataType type, ReduceOp op);
// `send` holds block r for rank r (`sblocks`); `recv` gets block r from rank r (`rblocks`).
void alltoall_pairwise(Call& call, const void* send, const Blocks& sblocks, void* recv,
                       const Blocks& rblocks);
// The same with `block` bytes for every rank, in ceil(log2 p) rounds (small blocks).
void alltoall_bruck(Call& call, const void* send, void* recv, std::size_t block);
// The root's `recv` gets rank r's `send_bytes` at block r (`rblocks`, the root's).
void gather_linear(Call& call, const void* send, std::size_t send_bytes, void* recv,
                   const Blocks& rblocks, int root);
// Rank r's `recv` gets block r of the root's `send` (`sblocks`, the root's).
void scatter_linear(Call& call, const void* send, const Blocks& sblocks, void* recv,
                    std::size_t recv_bytes, int root);
void barrier_dissemination(Call& call);
// Reduce-scatter by recursive halving, then allgather by recursive doubling (Rabenseifner).
// Out of place or in place, like allreduce_ring.
void allreduce_rabenseifner(Call& call, const void* send, void* recv, std::size_t count,
                            DataType type, ReduceOp op);
// Pipelined down the chain root, root+1, ..., root-1 in chunks of call.chunk_bytes.
void broadcast_chain(Call& call, void* data, std::size_t bytes, int root);
// `data` holds every rank's `block` bytes at rank * block; this rank's is in place on entry.
void allgather_bruck(Call& call, void* data, std::size_t block);

}  // namespace anview::collectives
