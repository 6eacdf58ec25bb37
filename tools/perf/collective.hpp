// anview-perf's collective benchmarks (nccl-tests columns): allreduce, broadcast, reduce,
// allgather, reduce_scatter, alltoall, barrier.
#pragma once

#include <string>
#include <vector>

#include "anview/anview.hpp"
#include "plot.hpp"
#include "progress.hpp"

namespace perf {

struct CollectiveOptions {
  std::string op;
  std::size_t min_bytes = 8;
  std::size_t max_bytes = 16 << 20;
  double factor = 4;
  long iters = 0;    // 0: automatic
  long warmup = -1;  // -1: automatic
  anview::DataType type = anview::DataType::float32;
  anview::ReduceOp redop = anview::ReduceOp::sum;
  int root = 0;
  bool check = false;
  bool in_place = false;    // allreduce and allgather: the receive buffer is the send buffer
  bool huge_pages = false;  // the buffers are anview::HostBuffers
  bool json = false;
};

bool is_collective(const std::string& op);
// Every collective anview-perf measures, in the order `all` runs them.
const std::vector<const char*>& collective_names();
// Runs the sweep on every rank; rank 0 prints, shows `progress` and appends each result line to
// `points`. Returns the number of wrong results.
long run_collective(anview::Communicator& comm, const CollectiveOptions& o, Progress& progress,
                    std::vector<PlotPoint>& points);

}  // namespace perf
