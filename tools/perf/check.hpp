// What anview-perf --check puts into a collective and what it expects back, for every
// collective it measures, every element type and every reduction: small integers (at most a
// few hundred after the reduction on up to 36 ranks), so that every type, bfloat16 included,
// holds inputs and results exactly. Each rank's input differs by rank and by index, so a
// block from the wrong rank or at the wrong place is counted as wrong.
#pragma once

#include <cstddef>
#include <string>

#include "anview/collectives.hpp"

namespace perf {

struct CheckCase {
  std::string op;  // allreduce, broadcast, reduce, allgather, reduce_scatter, alltoall, barrier
  anview::DataType type = anview::DataType::float32;
  anview::ReduceOp redop = anview::ReduceOp::sum;
  int root = 0;
  int ranks = 1;
  int rank = 0;
  std::size_t count = 0;  // elements per rank block (anview-perf's count column)
};

// Elements of this rank's send buffer: count * ranks for reduce_scatter and alltoall.
std::size_t send_elements(const CheckCase& c);
// Fills this rank's send buffer (send_elements(c) elements of c.type).
void fill_send(const CheckCase& c, void* send);
// The elements that differ from what the collective must leave: in `recv` (count * ranks
// elements for allgather and alltoall, count otherwise; reduce: the root's only), or in `send`
// for broadcast (its buffer). A barrier has no result: 0.
long count_wrong(const CheckCase& c, const void* send, const void* recv);

}  // namespace perf
