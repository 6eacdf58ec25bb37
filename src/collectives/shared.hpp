// Same-host collectives through the ranks' shared areas (transport::SharedArea): each rank
// publishes its contribution in its own area and raises a flag there; the others wait for the
// flag and read the data in place. No message and no system call: a small allreduce among the
// processes of one host costs a few cache-line transfers.
//
// An area holds two slots, used by alternate calls. Every call waits until every rank has
// published it, so when a rank reuses a slot two calls later, each peer has published the call
// in between and has therefore finished reading the slot. Calls are numbered by the
// communicator (the same on every rank, 1, 2, ...): a peer that published a later number than
// this rank's call has run more collectives, which is reported as a usage Error at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/algorithms.hpp"

namespace anview::collectives {

struct SharedAreas {
  char* own = nullptr;             // this rank's area
  std::vector<const char*> peers;  // by rank (null for this rank), mapped read-only
  bool crowded = false;            // more ranks than CPUs this process may run on
};

// The largest payload a slot holds, and the area size two slots need.
inline constexpr std::size_t shared_slot_payload = 64 * 1024;
std::size_t shared_area_needed();

// `seq` numbers the shared calls of the communicator (1, 2, ...). Results are the same bits
// on every rank: each reduces all contributions in rank order.
void allreduce_shared(Call& call, const SharedAreas& areas, std::uint64_t seq, const void* send,
                      void* recv, std::size_t count, DataType type, ReduceOp op);
// `recv` matters on the root only.
void reduce_shared(Call& call, const SharedAreas& areas, std::uint64_t seq, const void* send,
                   void* recv, std::size_t count, DataType type, ReduceOp op, int root);
// `block` bytes from every rank into `recv` (block r from rank r; this rank's may be in place).
void allgather_shared(Call& call, const SharedAreas& areas, std::uint64_t seq, const void* send,
                      void* recv, std::size_t block);
void broadcast_shared(Call& call, const SharedAreas& areas, std::uint64_t seq, void* data,
                      std::size_t bytes, int root);
void barrier_shared(Call& call, const SharedAreas& areas, std::uint64_t seq);

}  // namespace anview::collectives
