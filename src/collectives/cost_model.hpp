// The tuner's alpha-beta cost model (Hockney; Thakur, Rabenseifner and Gropp, "Optimization of
// Collective Communication Operations in MPICH", 2005): each candidate algorithm of a
// collective gets a predicted time from the number of messages it sends in sequence (alpha
// each), the bytes it moves over one link (beta per byte) and the bytes it reduces or copies
// locally. The parameters are measured on the job itself (tuning.hpp), agreed by every rank,
// so every rank predicts the same times and picks the same algorithm.
//
// Pure functions of their arguments: unit-tested without a communicator.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace anview::collectives {

// Measured costs, the worst over the ranks (the slowest link and the slowest rank set the pace
// of a collective).
struct CostModel {
  double alpha_us = 0;     // one small message between neighbouring ranks, send to receive
  double link_bpus = 0;    // bytes per microsecond of one large message over that link
  double read_bpus = 0;    // bytes per microsecond of reading a same-host peer's memory (0: none)
  double read_us = 0;      // one such read of a few bytes: the system call's own cost
  double reduce_bpus = 0;  // bytes per microsecond of reducing one buffer into another
  double copy_bpus = 0;    // bytes per microsecond of a local memcpy
  double flag_us = 0;      // one round of the shared-memory flags (0: no shared memory)
  // Ranks per CPU on the most crowded host (at least 1): a rank's own copies, reductions and
  // peer reads, measured at full speed, take that much longer when ranks share CPUs.
  double crowding = 1;
  // Between ranks of one host when the job spans hosts (0: not measured, use the above).
  double local_alpha_us = 0;
  double local_link_bpus = 0;
  std::string source;  // where the values came from: "probe", "tuning file <path>"
};

// The call's shape, and what the ranks of the communicator can use (agreed by all of them).
struct Topology {
  int ranks = 1;
  int hosts = 1;                 // hosts the ranks are on
  int largest_host = 1;          // ranks on the most crowded one
  bool shares_memory = false;    // one host, every shared area mapped: "shared" algorithms
  bool reads_peers = false;      // one host, cross-memory attach: "direct" algorithms
  std::size_t shared_limit = 0;  // the largest payload of a shared slot
  std::size_t shared_whole = 0;  // allreduce up to this: each rank reduces all contributions
  std::size_t chunk_bytes = 0;   // the ring's pipelining unit
  // Messages above this many bytes go by rendezvous: a request-to-send and a clear-to-send
  // travel before the data, two more latencies (ANVIEW_EAGER_BYTES).
  std::size_t eager_bytes = static_cast<std::size_t>(-1);
  std::size_t element_bytes = 4;  // of the call's data type (ring needs an element per rank)
  bool in_place = false;          // else some algorithms copy their input first
};

struct Candidate {
  std::string algorithm;
  bool usable = true;
  double predicted_us = 0;  // meaningful when usable
  std::string why_not;      // when not usable
};

// Every algorithm of `collective` ("allreduce", "broadcast", ...) for `bytes` (nccl-tests'
// size: the whole buffer, for allgather the gathered one), in order of preference on a tie.
// Empty for an unknown collective.
std::vector<Candidate> candidates(std::string_view collective, std::size_t bytes,
                                  const Topology& topology, const CostModel& model);

// The flat form of `collective` that one step of a hierarchical one runs: among `ranks` ranks,
// messages only, in place, with the links between hosts or (`inside_host`) those inside one.
// The cheapest candidate, with its predicted time.
Candidate flat_step(std::string_view collective, const Topology& topology, const CostModel& model,
                    std::size_t bytes, int ranks, bool inside_host);

// The usable candidate with the lowest predicted time (the first one on a tie), or -1.
int cheapest(const std::vector<Candidate>& candidates);

// The model's parameters in one line, for logs and anview-info --explain.
std::string describe(const CostModel& model);

}  // namespace anview::collectives
