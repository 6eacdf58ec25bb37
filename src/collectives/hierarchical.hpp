// Hierarchical collectives for jobs that span hosts: work inside each host first (over its
// fast links), then among one leader per host (over the network, once per host instead of
// once per rank), then inside each host again. The hosts are agreed by every rank when the
// communicator's placement is (collectives.hpp), so every rank sees the same layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "collectives/algorithms.hpp"

namespace anview::collectives {

struct HostLayout {
  std::vector<std::vector<int>> hosts;  // each host's ranks, ascending; by lowest rank
  std::vector<int> leaders;             // each host's lowest rank
  std::vector<int> host_of;             // by rank: its host's index
  std::vector<int> position;            // by rank: its index among its host's ranks
  int largest = 1;                      // ranks on the most crowded host

  // The layout of ranks whose hosts have these keys (one per rank; equal keys, same host).
  static HostLayout from_keys(const std::vector<std::uint64_t>& keys);
};

// allreduce of `data` in place: a binomial reduce to each host's leader, `among_leaders`
// ("recursive_doubling", "rabenseifner" or "ring") among the leaders, a binomial broadcast
// from each leader. Every rank ends with the same bits (the leaders' result).
void allreduce_hierarchical(Call& call, const HostLayout& layout, const std::string& among_leaders,
                            void* data, std::size_t count, DataType type, ReduceOp op);

// The algorithm each step of a hierarchical broadcast runs: "chain" (pipelined, large
// buffers) or "binomial".
struct BroadcastSteps {
  std::string between = "binomial";  // among one rank per host
  std::string within = "binomial";   // inside each host
};

// broadcast of `bytes` from `root`: among one representative per host (the root on its own
// host, each host's leader elsewhere), then inside each host from its representative. The
// network carries the buffer once per host instead of once per rank.
void broadcast_hierarchical(Call& call, const HostLayout& layout, const BroadcastSteps& steps,
                            void* data, std::size_t bytes, int root);

// reduce of `data` (this rank's contribution; clobbered unless this is the root) to `root`: a
// binomial reduce inside each host to its representative (as above), then among the
// representatives to the root.
void reduce_hierarchical(Call& call, const HostLayout& layout, void* data, std::size_t count,
                         DataType type, ReduceOp op, int root);

// allgather of `block` bytes per rank in `data` (rank r's at r * block; this rank's in place):
// each host's blocks gathered at its leader, the hosts' blocks passed around a ring of the
// leaders (one message per host and step, not per rank), then the whole buffer broadcast
// inside each host (`within`: "chain" or "binomial"). Where a host's ranks are not
// consecutive, the leaders work in a packed copy (`call.scratch`) and unpack it.
void allgather_hierarchical(Call& call, const HostLayout& layout, const std::string& within,
                            void* data, std::size_t block);

}  // namespace anview::collectives
