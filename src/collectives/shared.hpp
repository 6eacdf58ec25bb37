// Same-host collectives through the ranks' shared areas (transport::SharedArea): each rank
// publishes its contribution in its own area and raises a flag there; the others wait for the
// flag and read the data in place. No message and no system call: a small allreduce among the
// processes of one host costs a few cache-line transfers.
//
// An area holds a line that says which call its rank gave up on (and why), a ring of 16 call
// headers (a call's arguments, its flag and a payload of up to 32 bytes, in one cache line)
// and two payload slots for larger payloads, used by alternate calls. A rank rewrites a
// header line 16 calls later, a payload slot 2 calls later, only once every peer has finished
// reading it: certain where it saw the peer publish a later call (allreduce, allgather and
// barrier wait for all), else it looks, and where the peer is behind, waits until it is
// half a ring further. So a broadcast's root and a reduce's other ranks publish and return at
// once, up to 15 calls ahead of the slowest reader; the ranks that read are the ones that
// check the call's arguments (a mismatch is reported there).
// Calls are numbered by the communicator (the same on every rank, 1, 2, ...): a peer that
// published a later number than this rank's call has run more collectives, which is reported
// as a usage Error at once.
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
  // By rank: the last shared call this rank knows the peer published (its own bookkeeping).
  mutable std::vector<std::uint64_t> seen;
  // By rank: looks to make before looking half a ring ahead again (see Slots::claim()).
  mutable std::vector<std::uint8_t> skip_ahead;
  // By rank: the last shared call up to which this rank compared its calls with the peer's
  // (the arguments of calls where neither read the other are compared later, where the lines
  // are still there: Slots::check_past()).
  mutable std::vector<std::uint64_t> checked;
  // The last shared call in which a peer was seen calling it otherwise than this rank (every
  // rank that reads that peer's part of the call sees it too).
  mutable std::uint64_t usage_in_call = 0;
};

// The largest payload a slot holds, and the area size two slots need. A larger allreduce
// runs in stages of a part of the slot per rank: 256 KiB keeps a rank's two slots in L2 and a
// stage long next to its flag round (at 2 ranks, 16 MiB: 64 KiB slots gave 5.7 GB/s busbw,
// 256 KiB 6.9, 512 KiB 7.0, 1 MiB 6.8).
inline constexpr std::size_t shared_slot_payload = 256 * 1024;
// Up to this size every rank reduces the whole of all contributions itself (one flag round);
// above it the staged form, where each reduces its segment, is cheaper.
inline constexpr std::size_t shared_whole_bytes = 64 * 1024;
std::size_t shared_area_needed();

// `seq` numbers the shared calls of the communicator (1, 2, ...). Results are the same bits
// on every rank: each reduces all contributions in rank order.
//
// An allreduce above shared_whole_bytes runs in stages, a shared call each: it takes the
// numbers after `calls` (the communicator's count of shared calls) and advances it past them
// all, failed or not, so that a rank left behind meets a later number, never another call's
// data under its own. Only a call that ranks made with other arguments (a usage Error at its
// first stage, where every rank stops) takes a single number; a mismatch of an earlier call
// that one rank finds there (Slots::check_past()) does not count.
void allreduce_shared(Call& call, const SharedAreas& areas, std::uint64_t& calls, const void* send,
                      void* recv, std::size_t count, DataType type, ReduceOp op);
// What that needs of a slot: the whole input where it fits, else a cache line per rank.
inline std::size_t allreduce_shared_slot_bytes(std::size_t bytes, int ranks) {
  return bytes <= shared_whole_bytes ? bytes : static_cast<std::size_t>(ranks) * 64;
}
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
