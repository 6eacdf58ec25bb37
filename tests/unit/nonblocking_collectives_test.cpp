// Nonblocking collectives on thread-per-rank communicators: many in flight at once with point-
// to-point traffic beside them, blocking collectives queued behind them in call order, the
// completion callback, and errors delivered through the Request.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <latch>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "support/scoped_env.hpp"
#include "support/thread_ranks.hpp"

namespace anview {
namespace {

using testing::run_ranks;
using testing::ScopedEnv;

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

// Rank 1's part in the tests where rank 0 lets go of its communicator: it joins rank 0's first
// allreduce once rank 0 has let go, and its second (if `second`) once rank 0 is closing.
void joins_after_rank_zero_let_go(Communicator& comm, std::vector<std::int64_t>& data,
                                  bool second = false) {
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 0 has let go by now
  comm.allreduce(data.data(), data.size(), DataType::int64, ReduceOp::sum);
  if (!second) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 0 closes meanwhile
  comm.allreduce(data.data(), data.size(), DataType::int64, ReduceOp::sum);
}

// A completion callback holding the last handle of its communicator runs, and is destroyed,
// on the collective thread: the communicator closes there. Before, the worker joined its own
// thread in its destructor (std::system_error in a destructor: the process terminated).
TEST(NonblockingCollectives, TheLastHandleReleasedOnTheCollectiveThreadClosesTheCommunicator) {
  std::atomic<bool> called{false};
  run_ranks(2, [&](Communicator& comm) {
    auto data = std::make_shared<std::vector<std::int64_t>>(1000, comm.rank() + 1);
    if (comm.rank() == 1) return joins_after_rank_zero_let_go(comm, *data);
    Request r = comm.iallreduce(data->data(), data->size(), DataType::int64, ReduceOp::sum);
    r.on_complete([&called, data, keep = comm](const Status&, const Error* error) {
      EXPECT_EQ(error, nullptr);
      EXPECT_EQ((*data)[999], 3);
      called = true;
    });
  });  // rank 0's own handle is gone: the callback's copy is the last
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!called.load() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(called.load());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // it closes on that thread
}

// The same close on the collective thread, while another thread waits for a collective queued
// behind it: the waiter keeps asking the worker whether it may run that one itself (spinning,
// here for seconds), and the worker is freed meanwhile. Before, the question went through the
// freed worker (ASan: heap-use-after-free); now it goes to the queue alone, and the waiter gets
// the closed communicator's error.
TEST(NonblockingCollectives, AWaiterOfAQueuedCollectiveOutlivesTheWorkerClosedByACallback) {
  ScopedEnv spin("ANVIEW_SPIN_US", "3000000");
  for (int round = 0; round < 5; ++round) {  // the window is short: ASan caught 1 round in 3
    std::atomic<bool> called{false};
    std::atomic<int> waiter_error{-1};
    std::jthread waiter;  // last: joined before what it writes goes
    run_ranks(2, [&](Communicator& comm) {
      auto data = std::make_shared<std::vector<std::int64_t>>(1000, comm.rank() + 1);
      if (comm.rank() == 1) return joins_after_rank_zero_let_go(comm, *data);
      Request first = comm.iallreduce(data->data(), data->size(), DataType::int64, ReduceOp::sum);
      first.on_complete(
          [&called, data, keep = comm](const Status&, const Error*) { called = true; });
      auto more = std::make_shared<std::vector<std::int64_t>>(2000, 1);
      // Two behind it that rank 1 never joins: the waiter's is not next in line, so only the
      // closing fails it.
      Request second = comm.iallreduce(more->data(), 1000, DataType::int64, ReduceOp::sum);
      Request third = comm.iallreduce(more->data() + 1000, 1000, DataType::int64, ReduceOp::sum);
      waiter = std::jthread(
          [&waiter_error, more, second = std::move(second), third = std::move(third)]() mutable {
            try {
              third.wait(std::chrono::seconds(10));
              waiter_error = 0;
            } catch (const Error& e) {
              waiter_error = static_cast<int>(e.kind());
            }
          });
    });
    waiter.join();
    EXPECT_TRUE(called.load());
    EXPECT_EQ(waiter_error.load(), static_cast<int>(ErrorKind::usage));
  }
}

// The same close, while a waiter runs the next collective itself (run_here): the closing waits
// for it, as join() would, before the communicator is torn down. Before, the worker detached
// at once and the communicator was freed under the running collective (ASan:
// heap-use-after-free in the collective).
TEST(NonblockingCollectives, ACloseOnTheCollectiveThreadWaitsForTheCollectiveAWaiterRuns) {
  ScopedEnv spin("ANVIEW_SPIN_US", "3000000");
  std::atomic<bool> called{false};
  std::vector<std::int64_t> second(1000, 0);
  std::atomic<int> waiter_error{-1};
  std::jthread waiter;  // last: joined before what it writes goes
  run_ranks(2, [&](Communicator& comm) {
    auto data = std::make_shared<std::vector<std::int64_t>>(1000, comm.rank() + 1);
    if (comm.rank() == 1) return joins_after_rank_zero_let_go(comm, *data, true);
    Request first = comm.iallreduce(data->data(), data->size(), DataType::int64, ReduceOp::sum);
    first.on_complete([&called, data, keep = comm](const Status&, const Error*) {
      // The waiter takes the next collective meanwhile.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      called = true;
    });
    std::fill(second.begin(), second.end(), 1);
    Request next = comm.iallreduce(second.data(), second.size(), DataType::int64, ReduceOp::sum);
    waiter = std::jthread([&waiter_error, next = std::move(next)]() mutable {
      try {
        next.wait(std::chrono::seconds(10));
        waiter_error = 0;
      } catch (const Error& e) {
        waiter_error = static_cast<int>(e.kind()) + 1;
      }
    });
  });
  waiter.join();
  EXPECT_TRUE(called.load());
  EXPECT_EQ(waiter_error.load(), 0);
  EXPECT_EQ(second[999], 1 + 3);  // rank 1 passes its first result (1 + 2) again
}

// Started, then waited for at once (what torch's synchronous collectives do): a waiting thread
// that finds its collective next in line and not started runs it itself, rather than waiting
// for the collective thread; its completion callback then runs on the waiting thread, inside
// wait(). Made deterministic by holding the collective thread in the previous collective's
// completion callback: it completes that one with the queue already free, so user callbacks do
// not hold up the next collective (before, a waiter found the thread "running" and slept).
TEST(NonblockingCollectives, AWaiterRunsTheNextCollectiveItself) {
  // Rank 1 joins the first allreduce only once rank 0 has set its callback, which so runs on
  // the collective thread and not at once, inline, in on_complete.
  std::latch callback_set{1};
  // Rank 0's; outside the rank so that they outlive the callback that waits on them.
  std::latch entered{1}, release{1};
  std::atomic<bool> released{false};
  auto release_thread = [&] {
    if (!released.exchange(true)) release.count_down();
  };
  run_ranks(2, [&](Communicator& comm) {
    const auto me = std::this_thread::get_id();
    float a = 1.0f;
    if (comm.rank() == 1) callback_set.wait();
    Request first = comm.iallreduce(&a, 1, DataType::float32, ReduceOp::sum);
    if (comm.rank() == 0) {
      first.on_complete([&](const Status&, const Error*) {
        EXPECT_NE(std::this_thread::get_id(), me);
        entered.count_down();
        release.wait();
      });
      callback_set.count_down();
      entered.wait();  // the collective thread is now held in the callback
    }
    for (int i = 0; i < 3; ++i) {
      float x = 1.0f;
      Request next = comm.iallreduce(&x, 1, DataType::float32, ReduceOp::sum);
      auto ran_on = std::make_shared<std::atomic<std::thread::id>>();
      next.on_complete(
          [ran_on](const Status&, const Error*) { ran_on->store(std::this_thread::get_id()); });
      try {
        next.wait(std::chrono::seconds(10));
      } catch (const Error& e) {
        release_thread();  // the thread then runs what was left to it: the ranks end
        FAIL() << "the waiter did not run the collective, call " << i << ": " << e.what();
      }
      EXPECT_EQ(x, 2.0f);
      if (comm.rank() == 0) {
        EXPECT_EQ(ran_on->load(), me) << "call " << i;
      }
    }
    release_thread();
    first.wait();
    EXPECT_EQ(a, 2.0f);
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
