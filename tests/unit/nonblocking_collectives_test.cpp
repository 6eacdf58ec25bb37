// Nonblocking collectives on thread-per-rank communicators: many in flight at once with point-
// to-point traffic beside them, blocking collectives queued behind them in call order, the
// completion callback, and errors delivered through the Request.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "support/thread_ranks.hpp"

namespace anview {
namespace {

using testing::run_ranks;

float value(int rank, std::size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 5 + 1));
}

TEST(NonblockingCollectives, ManyInFlightWithPointToPointBeside) {
  for (int n : {1, 2, 3, 4}) {
    SCOPED_TRACE(n);
    run_ranks(n, [&](Communicator& comm) {
      // Sizes that take every same-host algorithm (shared, ring, direct).
      const std::size_t counts[] = {1, 100, 40000, 100000, 7};
      std::vector<std::vector<float>> bufs;
      std::vector<Request> requests;
      for (std::size_t count : counts) {
        std::vector<float> b(count);
        for (std::size_t i = 0; i < count; ++i) b[i] = value(comm.rank(), i);
        bufs.push_back(std::move(b));
      }
      for (auto& b : bufs)
        requests.push_back(comm.iallreduce(b.data(), b.size(), DataType::float32, ReduceOp::sum));
      std::vector<std::int32_t> ranks(static_cast<std::size_t>(n), -1);
      ranks[static_cast<std::size_t>(comm.rank())] = comm.rank();  // in place: own block
      Request gather = comm.iallgather(&ranks[static_cast<std::size_t>(comm.rank())], ranks.data(),
                                       1, DataType::int32);
      // Point-to-point in a ring while the collectives run.
      if (n > 1) {
        const int right = (comm.rank() + 1) % n, left = (comm.rank() + n - 1) % n;
        std::int64_t out = comm.rank(), in = -1;
        Request r = comm.irecv(&in, sizeof in, left, Tag{9});
        comm.send(&out, sizeof out, right, Tag{9});
        r.wait();
        EXPECT_EQ(in, left);
      }
      const std::int64_t ranks_sum = n * (n + 1) / 2;
      for (std::size_t k = 0; k < bufs.size(); ++k) {
        const Status st = requests[k].wait();
        EXPECT_EQ(st.bytes, bufs[k].size() * sizeof(float));
        for (std::size_t i = 0; i < bufs[k].size(); ++i)
          ASSERT_EQ(bufs[k][i], static_cast<float>(ranks_sum * static_cast<int>(i % 5 + 1)))
              << "request " << k << " element " << i;
      }
      gather.wait();
      for (int r = 0; r < n; ++r) EXPECT_EQ(ranks[static_cast<std::size_t>(r)], r);
    });
  }
}

TEST(NonblockingCollectives, BlockingOnesQueueBehindInCallOrder) {
  run_ranks(3, [&](Communicator& comm) {
    std::vector<float> a(50000, static_cast<float>(comm.rank() + 1)), b(10, 1.0f);
    Request first = comm.iallreduce(a.data(), a.size(), DataType::float32, ReduceOp::sum);
    // Blocking: runs after `first` on the collective thread; returns when done.
    comm.allreduce(b.data(), b.size(), DataType::float32, ReduceOp::max);
    EXPECT_TRUE(first.done()) << "the blocking allreduce overtook the nonblocking one";
    first.wait();
    EXPECT_EQ(a[0], 6.0f);
    EXPECT_EQ(b[0], 1.0f);
    comm.barrier();
    Request last = comm.ibarrier();
    last.wait();
  });
}

TEST(NonblockingCollectives, CallbackRunsOnceWithTheResult) {
  run_ranks(2, [&](Communicator& comm) {
    std::vector<std::int64_t> data(1000, comm.rank() + 1);
    std::atomic<int> calls{0};
    std::atomic<std::size_t> bytes{0};
    Request r = comm.iallreduce(data.data(), data.size(), DataType::int64, ReduceOp::sum);
    r.on_complete([&](const Status& st, const Error* error) {
      EXPECT_EQ(error, nullptr);
      bytes = st.bytes;
      ++calls;
    });
    while (!r.test()) {
    }
    r.wait();
    // The callback runs on the collective thread right after it marks the request done.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (calls.load() == 0 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    EXPECT_EQ(calls.load(), 1);
    EXPECT_EQ(bytes.load(), data.size() * sizeof(std::int64_t));
    EXPECT_EQ(data[999], 3);
  });
}

// Started, then waited for at once (what torch's synchronous collectives do): the waiting
// thread runs the collective itself when it is next in line, rather than waking the
// collective thread and sleeping. Its completion callback then runs on the waiting thread,
// inside wait(); otherwise only the collective thread runs it. Across many calls some must
// have run here (in practice nearly all).
TEST(NonblockingCollectives, AWaiterRunsTheNextCollectiveItself) {
  run_ranks(2, [&](Communicator& comm) {
    int ran_here = 0;
    for (int i = 0; i < 200; ++i) {
      float x = 1.0f;
      Request r = comm.iallreduce(&x, 1, DataType::float32, ReduceOp::sum);
      // Counted only when it ran inside wait() on this thread (a request already complete
      // runs its callback at once, in on_complete, which does not count).
      // Shared with the callback: wait() returns once the request is done, and when the
      // collective thread completed it, its callback may still be running then.
      struct Seen {
        std::atomic<bool> waiting{false}, on_this_thread{false};
      };
      auto seen = std::make_shared<Seen>();
      const auto me = std::this_thread::get_id();
      r.on_complete([seen, me](const Status&, const Error*) {
        seen->on_this_thread = seen->waiting && std::this_thread::get_id() == me;
      });
      seen->waiting = true;
      r.wait();
      ASSERT_EQ(x, 2.0f);
      ran_here += seen->on_this_thread ? 1 : 0;
    }
    EXPECT_GT(ran_here, 0);
  });
}

TEST(NonblockingCollectives, BadArgumentsFailTheRequestWithAUsageError) {
  run_ranks(2, [&](Communicator& comm) {
    Request r = comm.iallreduce(nullptr, nullptr, 10, DataType::float32, ReduceOp::band);
    try {
      r.wait();
      FAIL() << "an allreduce of float32 with band succeeded";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::usage);
      EXPECT_NE(std::string(e.what()).find("allreduce #"), std::string::npos) << e.what();
    }
    ASSERT_NE(r.error(), nullptr);
    // The communicator goes on.
    float x = 1.0f;
    comm.iallreduce(&x, 1, DataType::float32, ReduceOp::sum).wait();
    EXPECT_EQ(x, 2.0f);
  });
}

// Rank r contributes r + 1 elements; the count and displacement vectors are gone before the
// requests run, so the collectives must work on copies.
TEST(NonblockingCollectives, VectorVariantsCopyTheirCountsAndDisplacements) {
  for (int n : {1, 3, 4}) {
    SCOPED_TRACE(n);
    run_ranks(n, [&](Communicator& comm) {
      const auto un = static_cast<std::size_t>(n);
      const auto me = static_cast<std::size_t>(comm.rank());
      auto element = [](std::size_t from, std::size_t to, std::size_t i) {
        return static_cast<std::int32_t>(1000 * from + 100 * to + i);
      };
      std::size_t total = 0;
      for (std::size_t r = 0; r < un; ++r) total += r + 1;
      std::vector<std::int32_t> mine(me + 1), gathered(total, -1), at_root(total, -1),
          scattered(me + 1, -1), to_all, from_all(un * (me + 1), -1), all_blocks(total);
      for (std::size_t i = 0; i <= me; ++i) mine[i] = element(me, me, i);
      for (std::size_t r = 0, at = 0; r < un; ++r)
        for (std::size_t i = 0; i <= r; ++i) all_blocks[at++] = element(2, r, i);
      for (std::size_t to = 0; to < un; ++to)  // to rank `to`: to + 1 elements
        for (std::size_t i = 0; i <= to; ++i) to_all.push_back(element(me, to, i));
      std::vector<Request> requests;
      {
        std::vector<std::size_t> counts(un), displs(un), same(un, me + 1), packed(un);
        for (std::size_t r = 0, at = 0; r < un; ++r) {
          counts[r] = r + 1;
          displs[r] = at;
          at += r + 1;
        }
        for (std::size_t r = 0; r < un; ++r) packed[r] = r * (me + 1);
        const int root = n - 1;
        requests.push_back(comm.iallgatherv(mine.data(), me + 1, gathered.data(), counts, displs,
                                            DataType::int32));
        requests.push_back(
            comm.igatherv(mine.data(), me + 1, at_root.data(), counts, {}, DataType::int32, root));
        requests.push_back(comm.iscatterv(all_blocks.data(), counts, displs, scattered.data(),
                                          me + 1, DataType::int32, root % 2 == 0 ? root : 0));
        requests.push_back(comm.ialltoallv(to_all.data(), counts, displs, from_all.data(), same,
                                           packed, DataType::int32));
        std::fill(counts.begin(), counts.end(), 999999);  // too late to matter
        std::fill(displs.begin(), displs.end(), 999999);
      }
      EXPECT_EQ(requests[0].wait().bytes, total * sizeof(std::int32_t));
      for (auto& r : requests) r.wait();
      const int scatter_root = (n - 1) % 2 == 0 ? n - 1 : 0;
      for (std::size_t r = 0, at = 0; r < un; ++r) {
        for (std::size_t i = 0; i <= r; ++i, ++at) {
          EXPECT_EQ(gathered[at], element(r, r, i)) << r << " " << i;
          if (comm.rank() == n - 1) {
            EXPECT_EQ(at_root[at], element(r, r, i)) << r << " " << i;
          }
        }
      }
      for (std::size_t i = 0; i <= me; ++i) {
        // Every rank fills all_blocks the same way (element(2, ...)): the root's is scattered.
        EXPECT_EQ(scattered[i], element(2, me, i)) << "root " << scatter_root << " i " << i;
      }
      for (std::size_t from = 0; from < un; ++from)
        for (std::size_t i = 0; i <= me; ++i)
          EXPECT_EQ(from_all[from * (me + 1) + i], element(from, me, i)) << from << " " << i;
    });
  }
}

}  // namespace
}  // namespace anview
