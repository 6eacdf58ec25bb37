// anview-perf put / get: one-sided bandwidth between ranks 0 and 1, like ucx_perftest's
// ucp_put_bw / ucp_get_bw. Rank 1 registers a region and only waits (in a plain receive) for
// the end of each size; rank 0 issues a window of puts (then one flush) or of gets (then waits
// for them all) into or out of it. Latency columns: the time per operation in a window; with
// --window 1, one put+flush or one get round trip.
#pragma once

#include <cstddef>
#include <vector>

#include "anview/anview.hpp"

namespace perf {

struct OneSidedRun {
  bool put = true;
  std::size_t bytes = 0;
  int window = 0;  // 0: automatic
  long iters = 0;  // a multiple of the window
  long warmup = 0;
  bool check = false;
  bool huge_pages = false;  // the initiator's buffer is an anview::HostBuffer
};

struct OneSidedResult {
  std::vector<double> per_window_us;  // time per operation, per window
  double total_us = 0;
  long wrong = 0;  // counted on the rank that checks (rank 1 for put, rank 0 for get)
};

// Both ranks call it with the same run; `region` is rank 1's, registered for the largest size.
OneSidedResult measure_one_sided(anview::Communicator& comm, const OneSidedRun& run,
                                 const anview::RemoteKey& target, unsigned char* region);

// The automatic window for `bytes` (as for bw).
int one_sided_window(std::size_t bytes);

}  // namespace perf
