// anview-perf --check (tools/perf/check.hpp): real collectives on thread ranks come out with
// no element counted wrong, for every collective, element type and reduction; and results
// with a wrong element, a block from the wrong rank, or nothing written are counted.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "check.hpp"
#include "support/collective_types.hpp"
#include "support/thread_ranks.hpp"

namespace anview {
// Named: a unity build compiles this file together with other tests that have helpers of the
// same names in their anonymous namespaces.
namespace perf_check_test {
namespace {

using perf::CheckCase;
using testing::every_data_type;
using testing::every_reduce_op;
using testing::run_ranks;

bool is_float(DataType t) {
  return t == DataType::float16 || t == DataType::bfloat16 || t == DataType::float32 ||
         t == DataType::float64;
}
bool bitwise(ReduceOp op) {
  return op == ReduceOp::band || op == ReduceOp::bor || op == ReduceOp::bxor;
}

// Buffers as anview-perf sizes them: `count` per rank block, count * ranks for the kinds with
// blocks; the receive buffer starts with all bits set.
struct Buffers {
  std::vector<char> send, recv;
};

Buffers run_one(Communicator& comm, const CheckCase& c) {
  const std::size_t es = size_of(c.type);
  const std::size_t total = c.count * static_cast<std::size_t>(c.ranks);
  Buffers b{std::vector<char>(total * es + 1), std::vector<char>(total * es + 1, '\xFF')};
  perf::fill_send(c, b.send.data());
  void* s = b.send.data();
  void* r = b.recv.data();
  if (c.op == "allreduce") comm.allreduce(s, r, c.count, c.type, c.redop);
  if (c.op == "reduce") comm.reduce(s, r, c.count, c.type, c.redop, c.root);
  if (c.op == "reduce_scatter") comm.reduce_scatter(s, r, c.count, c.type, c.redop);
  if (c.op == "broadcast") comm.broadcast(s, c.count, c.type, c.root);
  if (c.op == "allgather") comm.allgather(s, r, c.count, c.type);
  if (c.op == "alltoall") comm.alltoall(s, r, c.count, c.type);
  return b;
}

TEST(PerfCheck, RealCollectivesOfEveryTypeAndOperationHaveNothingWrong) {
  for (const int ranks : {3, 4}) {
    run_ranks(ranks, [&](Communicator& comm) {
      for (const DataType type : every_data_type) {
        for (const std::string op :
             {"allreduce", "reduce", "reduce_scatter", "broadcast", "allgather", "alltoall"}) {
          const bool reduction = op == "allreduce" || op == "reduce" || op == "reduce_scatter";
          for (const ReduceOp redop : every_reduce_op) {
            if (!reduction && redop != ReduceOp::sum) continue;
            if (bitwise(redop) && is_float(type)) continue;
            const CheckCase c{.op = op,
                              .type = type,
                              .redop = redop,
                              .root = ranks - 1,
                              .ranks = ranks,
                              .rank = comm.rank(),
                              .count = 37};
            const Buffers b = run_one(comm, c);
            ASSERT_EQ(perf::count_wrong(c, b.send.data(), b.recv.data()), 0)
                << op << " " << name_of(type) << " " << name_of(redop) << " on " << ranks
                << " ranks, rank " << comm.rank();
          }
        }
      }
    });
  }
}

TEST(PerfCheck, AWrongElementAMisplacedBlockAndAnUnwrittenResultAreCounted) {
  run_ranks(3, [](Communicator& comm) {
    const std::size_t count = 5;
    CheckCase c{.op = "allreduce",
                .type = DataType::float16,
                .redop = ReduceOp::avg,
                .ranks = 3,
                .rank = comm.rank(),
                .count = count};
    Buffers b = run_one(comm, c);
    ASSERT_EQ(perf::count_wrong(c, b.send.data(), b.recv.data()), 0);
    b.recv[2 * 2] ^= 0x04;  // element 2, one mantissa bit off: beyond float16's tolerance
    EXPECT_EQ(perf::count_wrong(c, b.send.data(), b.recv.data()), 1);

    c.op = "allgather";
    c.type = DataType::int32;
    b = run_one(comm, c);
    ASSERT_EQ(perf::count_wrong(c, b.send.data(), b.recv.data()), 0);
    std::vector<char> swapped = b.recv;  // rank 0's and rank 1's blocks trade places
    std::memcpy(swapped.data(), b.recv.data() + count * 4, count * 4);
    std::memcpy(swapped.data() + count * 4, b.recv.data(), count * 4);
    EXPECT_EQ(perf::count_wrong(c, b.send.data(), swapped.data()), 2 * static_cast<long>(count));

    c.op = "reduce_scatter";
    c.type = DataType::uint8;
    c.redop = ReduceOp::bor;
    const std::vector<char> unwritten(count * 3, '\xFF');
    EXPECT_EQ(perf::count_wrong(c, b.send.data(), unwritten.data()), static_cast<long>(count));

    c.op = "broadcast";  // the result is the buffer itself: a rank's own input is wrong
    c.type = DataType::bfloat16;
    c.root = 0;
    std::vector<char> own(count * 2);
    perf::fill_send(c, own.data());
    EXPECT_EQ(perf::count_wrong(c, own.data(), nullptr), comm.rank() == 0 ? 0 : 5);
  });
}

}  // namespace
}  // namespace perf_check_test
}  // namespace anview
