// Collectives on thread-per-rank communicators (real sockets and shared memory between the
// threads): every collective on 1 to 8 ranks, powers of two and not, sizes 0, 1, odd, not
// divisible by the rank count and larger than a ring segment; every operation and type; the
// message-passing allreduce, broadcast and allgather algorithms, forced by ANVIEW_ALGO; and the
// errors for unsupported or mismatched calls and unknown forced algorithms.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "collectives/reduce.hpp"
#include "support/scoped_env.hpp"
#include "support/thread_ranks.hpp"

namespace anview {
namespace {

using testing::run_ranks;

using testing::ScopedEnv;

// Rank r's element i: small integers, so float sums are exact.
std::int64_t contribution(int rank, std::size_t i) {
  return (rank + 1) * static_cast<std::int64_t>(i % 7 + 1);
}

const int rank_counts[] = {1, 2, 3, 4, 5, 6, 7, 8};
const std::size_t counts[] = {0, 1, 7, 1000, 100003};

TEST(ReduceKernels, HalfAndBfloat16RoundTrip) {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 1000.5f}) {
    EXPECT_EQ(collectives::half_to_float(collectives::float_to_half(f)), f) << f;
  }
  EXPECT_TRUE(std::isinf(collectives::half_to_float(collectives::float_to_half(1e6f))));
  EXPECT_TRUE(std::isnan(collectives::half_to_float(collectives::float_to_half(NAN))));
  for (float f : {0.0f, 1.0f, -3.0f, 256.0f, 1.5f}) {
    EXPECT_EQ(collectives::bfloat16_to_float(collectives::float_to_bfloat16(f)), f) << f;
  }
  // Round to nearest even: 1 + 2^-11 is halfway between two halves and goes down to 1.
  EXPECT_EQ(collectives::half_to_float(collectives::float_to_half(1.0f + 0x1p-11f)), 1.0f);
}

TEST(ReduceKernels, BitwiseOpsNeedIntegers) {
  EXPECT_FALSE(collectives::unsupported(DataType::float32, ReduceOp::band).empty());
  EXPECT_FALSE(collectives::unsupported(DataType::bfloat16, ReduceOp::bxor).empty());
  EXPECT_TRUE(collectives::unsupported(DataType::uint8, ReduceOp::bor).empty());
  EXPECT_TRUE(collectives::unsupported(DataType::float16, ReduceOp::max).empty());
}

void check_allreduce_sum(int n) {
  run_ranks(n, [&](Communicator& comm) {
    for (std::size_t count : counts) {
      std::vector<float> f(count);
      std::vector<std::int32_t> i32(count);
      for (std::size_t i = 0; i < count; ++i) {
        f[i] = static_cast<float>(contribution(comm.rank(), i));
        i32[i] = static_cast<std::int32_t>(contribution(comm.rank(), i));
      }
      std::vector<float> out(count);
      comm.allreduce(f.data(), out.data(), count, DataType::float32, ReduceOp::sum);
      comm.allreduce(i32.data(), count, DataType::int32, ReduceOp::sum);  // in place
      const std::int64_t ranks_sum = n * (n + 1) / 2;
      for (std::size_t i = 0; i < count; ++i) {
        const auto want = ranks_sum * static_cast<std::int64_t>(i % 7 + 1);
        ASSERT_EQ(out[i], static_cast<float>(want)) << "count " << count << " index " << i;
        ASSERT_EQ(i32[i], want) << "count " << count << " index " << i;
      }
    }
  });
}

// Forces allreduce=`algo` and checks its sums on every rank count.
void check_allreduce_sum_forced(const std::string& algo) {
  ScopedEnv forced("ANVIEW_ALGO", ("allreduce=" + algo).c_str());
  for (int n : rank_counts) {
    SCOPED_TRACE(n);
    check_allreduce_sum(n);
  }
}

TEST(Collectives, AllreduceSumEveryRankCountRing) {
  check_allreduce_sum_forced("ring");
}

TEST(Collectives, AllreduceSumEveryRankCountRecursiveDoubling) {
  check_allreduce_sum_forced("recursive_doubling");
}

TEST(Collectives, AllreduceSumEveryRankCountRabenseifner) {
  check_allreduce_sum_forced("rabenseifner");
}

// Ranks that are threads of one process reach each other over shm, and cross-memory attach
// works within the process: the direct algorithms run here too (and under TSan).
TEST(Collectives, AllreduceSumEveryRankCountDirect) {
  check_allreduce_sum_forced("direct");
}

// A rank whose part of a direct allreduce fails (here: rank 2 cannot read rank 0's pages of
// segment 2, which rank 0 made unreadable) writes no segment 2 into its peers. Every rank must
// fail: rank 1, whose own reads and writes all went well, used to hear a plain "done" from
// rank 2 and return success with segment 2 of its result never written. And the failed read
// fails the call, not rank 2's link to rank 0: rank 2 used to close it, and so stopped waiting
// for rank 0's done (it could return while rank 0 still wrote into its receive buffer), and
// the two could not talk any more.
TEST(Collectives, AllreduceDirectFailsOnEveryRankWhenOnePeerFailsItsPart) {
  ScopedEnv forced("ANVIEW_ALGO", "allreduce=direct");
  constexpr std::size_t segment_floats = 4096;  // four pages each: segment 2 is whole pages
  constexpr std::size_t count = 3 * segment_floats;
  constexpr std::size_t bytes = count * sizeof(float);
  // Every rank's buffers outlive all the ranks (as they had to while rank 2 closed its link to
  // rank 0 and could return while rank 0 still wrote into its receive buffer).
  std::vector<float*> send(3);
  std::vector<std::vector<float>> recv(3, std::vector<float>(count, -1.0f));
  for (auto& s : send) {
    void* mapped =
        ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(mapped, MAP_FAILED);
    s = static_cast<float*>(mapped);
    std::fill(s, s + count, 1.0f);
  }
  // Rank 0 reads only its own segment 0 of its send buffer.
  ASSERT_EQ(::mprotect(send[0] + 2 * segment_floats, segment_floats * sizeof(float), PROT_NONE), 0);
  std::vector<std::string> outcome(3);
  run_ranks(
      3,
      [&](Communicator& comm) {
        const auto me = static_cast<std::size_t>(comm.rank());
        try {
          comm.allreduce(send[me], recv[me].data(), count, DataType::float32, ReduceOp::sum);
          outcome[me] = "success, element " + std::to_string(2 * segment_floats) + " = " +
                        std::to_string(recv[me][2 * segment_floats]);
        } catch (const Error& e) {
          outcome[me] = e.what();
        }
        // Every link is still up: a message around the ring, both ways.
        const int next = (comm.rank() + 1) % 3, prev = (comm.rank() + 2) % 3;
        int out = comm.rank(), from_prev = -1, from_next = -1;
        try {
          Request r1 = comm.irecv(&from_prev, sizeof from_prev, prev, Tag{7});
          Request r2 = comm.irecv(&from_next, sizeof from_next, next, Tag{8});
          comm.send(&out, sizeof out, next, Tag{7}, std::chrono::seconds(5));
          comm.send(&out, sizeof out, prev, Tag{8}, std::chrono::seconds(5));
          r1.wait(std::chrono::seconds(5));
          r2.wait(std::chrono::seconds(5));
        } catch (const Error& e) {
          ADD_FAILURE() << "rank " << comm.rank() << " after the failed call: " << e.what();
        }
        EXPECT_EQ(from_prev, prev);
        EXPECT_EQ(from_next, next);
      },
      std::chrono::seconds(10));
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(outcome[static_cast<std::size_t>(r)].rfind("success", 0), std::string::npos)
        << "rank " << r << ": " << outcome[static_cast<std::size_t>(r)];
  EXPECT_NE(outcome[1].find("anview remote error"), std::string::npos) << outcome[1];
  EXPECT_NE(outcome[1].find("rank 2 failed its part of the call"), std::string::npos) << outcome[1];
  // Rank 0 hears from rank 2 what went wrong (rank 2's own read failed: a protocol error).
  EXPECT_NE(outcome[0].find("rank 2 failed its part of the call (protocol error)"),
            std::string::npos)
      << outcome[0];
  for (float* s : send) ::munmap(s, bytes);
}

// Rank 0's wait for the others' go words times out (its timeout is short), but they were only
// late: their postings to each other waited behind a full ring (rank 2 had paused reading rank
// 1's, over its unexpected-message budget, until a thread of its own took those messages).
// Once on time again they say go and write into rank 0's receive buffer: rank 0 must not have
// returned by then. Before, it waited only for the done of ranks whose go had come in time,
// and returned while the two still wrote into its buffer.
TEST(Collectives, AllreduceDirectWaitsForPeersWhoseGoCameLate) {
  ScopedEnv forced("ANVIEW_ALGO", "allreduce=direct");
  ScopedEnv budget("ANVIEW_UNEXPECTED_BYTES", "1M");
  constexpr std::size_t count = 3 * 4096;                     // a segment of 4096 per rank
  constexpr std::size_t filler_bytes = 2048, fillers = 2048;  // 4 MiB: budget and ring full
  constexpr auto short_timeout = std::chrono::milliseconds(3000);
  constexpr auto stall = std::chrono::milliseconds(4500);  // halfway between one and two timeouts
  std::vector<std::vector<float>> send(3, std::vector<float>(count, 1.0f));
  std::vector<std::vector<float>> recv(3, std::vector<float>(count, -1.0f));
  std::vector<float> at_return;  // rank 0's receive buffer when its call returned
  std::string rank0_outcome, taker_error;
  std::atomic<std::int64_t> rank0_called{0};  // steady clock, ns; 0: not yet
  run_ranks(
      3,
      [&](Communicator& comm) {
        const auto me = static_cast<std::size_t>(comm.rank());
        // A first call sets up what every direct call uses (and takes its own messages).
        comm.allreduce(send[me].data(), recv[me].data(), count, DataType::float32, ReduceOp::sum);
        std::fill(recv[me].begin(), recv[me].end(), -1.0f);
        std::vector<char> filler(filler_bytes * fillers);
        std::vector<Request> sent;
        std::jthread taker;
        if (me == 1) {
          for (std::size_t i = 0; i < fillers; ++i)
            sent.push_back(comm.isend(filler.data() + i * filler_bytes, filler_bytes, 2, Tag{99}));
        } else if (me == 2) {
          taker = std::jthread([&] {
            try {
              for (int i = 0; i < 10000 && rank0_called.load() == 0; ++i)
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
              std::this_thread::sleep_until(std::chrono::steady_clock::time_point(
                                                std::chrono::nanoseconds(rank0_called.load())) +
                                            stall);
              std::vector<Request> taken;
              for (std::size_t i = 0; i < fillers; ++i)
                taken.push_back(
                    comm.irecv(filler.data() + i * filler_bytes, filler_bytes, 1, Tag{99}));
              for (auto& r : taken) r.wait(std::chrono::seconds(10));
            } catch (const Error& e) {
              taker_error = e.what();
            }
          });
        }
        if (me == 0) rank0_called = std::chrono::steady_clock::now().time_since_epoch().count();
        try {
          comm.allreduce(send[me].data(), recv[me].data(), count, DataType::float32, ReduceOp::sum);
          if (me == 0) rank0_outcome = "success";
        } catch (const Error& e) {
          if (me == 0) rank0_outcome = e.what();
        }
        if (me == 0) at_return = recv[0];
        for (auto& r : sent) r.wait(std::chrono::seconds(10));
      },
      std::chrono::seconds(10), nullptr,
      [&](int rank) { return rank == 0 ? short_timeout : std::chrono::milliseconds(12000); });
  EXPECT_EQ(taker_error, "");
  EXPECT_NE(rank0_outcome.find("anview timeout error"), std::string::npos) << rank0_outcome;
  ASSERT_EQ(at_return.size(), count);
  // Ranks 1 and 2 said go late and wrote their segments of rank 0's result, before it returned.
  EXPECT_TRUE(std::all_of(at_return.begin() + 4096, at_return.end(), [](float v) {
    return v == 3.0f;
  })) << "ranks 1 and 2 did not write into rank 0's buffer before its call returned";
  EXPECT_TRUE(at_return == recv[0]) << "rank 0's receive buffer changed after its call returned";
}

TEST(Collectives, ReduceScatterDirectEveryRankCountInAndOutOfPlace) {
  ScopedEnv forced("ANVIEW_ALGO", "reduce_scatter=direct");
  for (int n : rank_counts) {
    SCOPED_TRACE(n);
    run_ranks(n, [&](Communicator& comm) {
      const int me = comm.rank();
      for (std::size_t count : counts) {
        const std::size_t total = count * static_cast<std::size_t>(n);
        std::vector<float> blocks(total), reduced(count, -1);
        for (std::size_t i = 0; i < total; ++i) blocks[i] = static_cast<float>(contribution(me, i));
        comm.reduce_scatter(blocks.data(), reduced.data(), count, DataType::float32, ReduceOp::sum);
        const std::int64_t ranks_sum = n * (n + 1) / 2;
        const std::size_t first = static_cast<std::size_t>(me) * count;
        for (std::size_t i = 0; i < count; ++i) {
          ASSERT_EQ(reduced[i],
                    static_cast<float>(ranks_sum * static_cast<std::int64_t>((first + i) % 7 + 1)))
              << "count " << count << " index " << i;
        }
        // In place: the result lands on this rank's own block of the send buffer.
        comm.reduce_scatter(blocks.data(), blocks.data() + first, count, DataType::float32,
                            ReduceOp::max);
        for (std::size_t i = 0; i < count; ++i) {
          ASSERT_EQ(blocks[first + i], static_cast<float>(contribution(n - 1, first + i)))
              << "count " << count << " index " << i;
        }
      }
    });
  }
}

// In place with the very same buffer (MPI_IN_PLACE's layout): the input is every block of
// `data`, the result lands at its start, over block 0, which ranks other than 0 also send
// from. Every algorithm, with blocks above the eager size (a rendezvous send is read from
// the buffer after it was posted) cut into many small chunks. On 2 ranks the ring's only step
// both sends block 0 and reduces into it: rank 1 overwrote chunks of that block that rank 0
// had not read yet (rank 0 got wrong sums in about one run in five, 10 rounds each).
TEST(Collectives, ReduceScatterInPlaceWithTheSameBufferEveryAlgorithm) {
  ScopedEnv chunks("ANVIEW_COLL_CHUNK", "4K");
  for (const char* algo : {"ring", "recursive_halving", "direct"}) {
    ScopedEnv forced("ANVIEW_ALGO", (std::string("reduce_scatter=") + algo).c_str());
    for (int n : {2, 3, 4}) {
      SCOPED_TRACE(std::string(algo) + " on " + std::to_string(n) + " ranks");
      run_ranks(n, [&](Communicator& comm) {
        const int me = comm.rank();
        for (std::size_t count : {std::size_t{7}, std::size_t{300000}, std::size_t{300000},
                                  std::size_t{300000}, std::size_t{300000}}) {
          const std::size_t total = count * static_cast<std::size_t>(n);
          std::vector<float> data(total);
          for (std::size_t i = 0; i < total; ++i) data[i] = static_cast<float>(contribution(me, i));
          comm.reduce_scatter(data.data(), data.data(), count, DataType::float32, ReduceOp::sum);
          const std::int64_t ranks_sum = n * (n + 1) / 2;
          const std::size_t first = static_cast<std::size_t>(me) * count;
          for (std::size_t i = 0; i < count; ++i) {
            ASSERT_EQ(data[i], static_cast<float>(ranks_sum *
                                                  static_cast<std::int64_t>((first + i) % 7 + 1)))
                << "count " << count << " index " << i << " on rank " << me;
          }
        }
      });
    }
  }
}

// gather and scatter in place with the very same buffer at every root: gather's contribution
// is the buffer's first block, scatter's own block lands over block 0. At a root other than
// 0, rank 0's block once landed over the root's contribution before the root copied it
// (gather), and the root's own block overwrote block 0 before rank 0 had read it (scatter).
TEST(Collectives, GatherAndScatterInPlaceWithTheSameBufferAtEveryRoot) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    run_ranks(n, [&](Communicator& comm) {
      const int me = comm.rank();
      const auto un = static_cast<std::size_t>(n);
      for (int root = 0; root < n; ++root) {
        for (std::size_t count : {std::size_t{7}, std::size_t{100000}}) {
          std::vector<std::int32_t> buf(count * un, -1);
          for (std::size_t i = 0; i < count; ++i)
            buf[i] = static_cast<std::int32_t>(contribution(me, i));
          comm.gather(buf.data(), buf.data(), count, DataType::int32, root);
          for (std::size_t i = 0; me == root && i < count * un; ++i) {
            ASSERT_EQ(buf[i], contribution(static_cast<int>(i / count), i % count))
                << "gather to root " << root << ", count " << count << ", element " << i;
          }
          for (std::size_t i = 0; i < count * un; ++i)
            buf[i] = static_cast<std::int32_t>(contribution(static_cast<int>(i / count), i));
          comm.scatter(buf.data(), buf.data(), count, DataType::int32, root);
          const std::size_t first = static_cast<std::size_t>(me) * count;
          for (std::size_t i = 0; i < count; ++i) {
            ASSERT_EQ(buf[i], contribution(me, first + i))
                << "scatter from root " << root << ", count " << count << ", element " << i
                << " on rank " << me;
          }
        }
      }
    });
  }
}

// int32 max and float64 avg in place, and a float32 sum whose rounding depends on the order
// of the additions: every rank must end with the same bits (each segment reduced by one owner).
TEST(Collectives, AllreduceRabenseifnerMaxAvgAndTheSameBitsOnEveryRank) {
  ScopedEnv algo("ANVIEW_ALGO", "allreduce=rabenseifner");
  auto inexact = [](int rank, std::size_t i) {
    return 0.1f * static_cast<float>(rank + 1) + 1e-3f * static_cast<float>(i % 1013);
  };
  for (int n : rank_counts) {
    SCOPED_TRACE(n);
    std::vector<std::vector<std::vector<float>>> sums(static_cast<std::size_t>(n));
    run_ranks(n, [&](Communicator& comm) {
      for (std::size_t count : counts) {
        std::vector<std::int32_t> i32(count);
        std::vector<double> f64(count);
        std::vector<float> f32(count);
        for (std::size_t i = 0; i < count; ++i) {
          i32[i] = static_cast<std::int32_t>(contribution(comm.rank(), i));
          f64[i] = static_cast<double>(contribution(comm.rank(), i));
          f32[i] = inexact(comm.rank(), i);
        }
        comm.allreduce(i32.data(), count, DataType::int32, ReduceOp::max);
        comm.allreduce(f64.data(), count, DataType::float64, ReduceOp::avg);
        comm.allreduce(f32.data(), count, DataType::float32, ReduceOp::sum);
        const std::int64_t ranks_sum = n * (n + 1) / 2;
        for (std::size_t i = 0; i < count; ++i) {
          const auto k = static_cast<std::int64_t>(i % 7 + 1);
          ASSERT_EQ(i32[i], contribution(n - 1, i)) << "count " << count << " index " << i;
          ASSERT_EQ(f64[i], static_cast<double>(ranks_sum * k) / n)
              << "count " << count << " " << i;
          double want = 0;
          for (int r = 0; r < n; ++r) want += inexact(r, i);
          ASSERT_NEAR(f32[i], want, 1e-4 * n) << "count " << count << " index " << i;
        }
        sums[static_cast<std::size_t>(comm.rank())].push_back(std::move(f32));
      }
    });
    for (int r = 1; r < n; ++r) {
      for (std::size_t c = 0; c < sums[0].size(); ++c) {
        const auto& mine = sums[static_cast<std::size_t>(r)][c];
        ASSERT_EQ(mine.size(), sums[0][c].size());
        if (mine.empty()) continue;
        ASSERT_EQ(std::memcmp(mine.data(), sums[0][c].data(), mine.size() * sizeof(float)), 0)
            << "rank " << r << " count " << mine.size();
      }
    }
  }
}

TEST(Collectives, AllreduceEveryOperationAndType) {
  const int n = 3;
  run_ranks(n, [&](Communicator& comm) {
    const std::size_t count = 37;
    auto value = [&](int rank, std::size_t i) { return contribution(rank, i); };
    auto fold = [&](std::size_t i, ReduceOp op) {
      std::int64_t acc = value(0, i);
      for (int r = 1; r < n; ++r) {
        const std::int64_t v = value(r, i);
        switch (op) {
          case ReduceOp::sum:
          case ReduceOp::avg:
            acc += v;
            break;
          case ReduceOp::prod:
            acc *= v;
            break;
          case ReduceOp::min:
            acc = std::min(acc, v);
            break;
          case ReduceOp::max:
            acc = std::max(acc, v);
            break;
          case ReduceOp::band:
            acc &= v;
            break;
          case ReduceOp::bor:
            acc |= v;
            break;
          case ReduceOp::bxor:
            acc ^= v;
            break;
        }
      }
      return op == ReduceOp::avg ? acc / n : acc;
    };
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg,
                        ReduceOp::band, ReduceOp::bor, ReduceOp::bxor}) {
      SCOPED_TRACE(std::string(name_of(op)));
      std::vector<std::int64_t> i64(count);
      std::vector<std::uint8_t> u8(count);
      for (std::size_t i = 0; i < count; ++i) {
        i64[i] = value(comm.rank(), i);
        u8[i] = static_cast<std::uint8_t>(value(comm.rank(), i));
      }
      comm.allreduce(i64.data(), count, DataType::int64, op);
      comm.allreduce(u8.data(), count, DataType::uint8, op);
      for (std::size_t i = 0; i < count; ++i) {
        ASSERT_EQ(i64[i], fold(i, op)) << i;
        // uint8 wraps modulo 256; avg divides the wrapped sum.
        if (op != ReduceOp::avg && op != ReduceOp::prod && op != ReduceOp::sum) {
          ASSERT_EQ(u8[i], static_cast<std::uint8_t>(fold(i, op))) << i;
        }
      }
    }
    // Floating types, where the operations are defined.
    for (DataType type : {DataType::float16, DataType::bfloat16, DataType::float64}) {
      SCOPED_TRACE(std::string(name_of(type)));
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::avg}) {
        std::vector<char> buf(count * size_of(type));
        for (std::size_t i = 0; i < count; ++i) {
          const auto v = static_cast<float>(value(comm.rank(), i));
          if (type == DataType::float64) {
            const double d = v;
            std::memcpy(buf.data() + i * 8, &d, 8);
          } else {
            const std::uint16_t h = type == DataType::float16 ? collectives::float_to_half(v)
                                                              : collectives::float_to_bfloat16(v);
            std::memcpy(buf.data() + i * 2, &h, 2);
          }
        }
        comm.allreduce(buf.data(), count, type, op);
        for (std::size_t i = 0; i < count; ++i) {
          double got;
          if (type == DataType::float64) {
            std::memcpy(&got, buf.data() + i * 8, 8);
          } else {
            std::uint16_t h;
            std::memcpy(&h, buf.data() + i * 2, 2);
            got = type == DataType::float16 ? collectives::half_to_float(h)
                                            : collectives::bfloat16_to_float(h);
          }
          double want = static_cast<double>(fold(i, op == ReduceOp::avg ? ReduceOp::sum : op));
          if (op == ReduceOp::avg) want /= n;
          ASSERT_NEAR(got, want, std::abs(want) * 1e-2) << i;
        }
      }
    }
  });
}

TEST(Collectives, BroadcastAndReduceFromEveryRoot) {
  for (int n : {1, 2, 3, 5, 8}) {
    SCOPED_TRACE(n);
    run_ranks(n, [&](Communicator& comm) {
      for (int root = 0; root < n; ++root) {
        for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{100003}}) {
          std::vector<std::int32_t> data(count, comm.rank() == root ? root + 100 : -1);
          comm.broadcast(data.data(), count, DataType::int32, root);
          for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(data[i], root + 100);

          std::vector<std::int64_t> mine(count), result(count, -7);
          for (std::size_t i = 0; i < count; ++i) mine[i] = contribution(comm.rank(), i);
          comm.reduce(mine.data(), result.data(), count, DataType::int64, ReduceOp::max, root);
          for (std::size_t i = 0; i < count; ++i) {
            ASSERT_EQ(result[i], comm.rank() == root ? contribution(n - 1, i) : -7) << i;
          }
        }
      }
    });
  }
}

// Chunks of 4 KiB, so that the larger counts go down the chain in many pipelined pieces.
TEST(Collectives, BroadcastChainFromEveryRootEveryRankCount) {
  ScopedEnv algo("ANVIEW_ALGO", "broadcast=chain");
  ScopedEnv chunk("ANVIEW_COLL_CHUNK", "4096");
  for (int n : rank_counts) {
    SCOPED_TRACE(n);
    run_ranks(n, [&](Communicator& comm) {
      ASSERT_EQ(comm.collective_algorithm("broadcast", 100), "chain");
      for (int root = 0; root < n; ++root) {
        for (std::size_t count : counts) {
          auto value = [&](std::size_t i) {
            return static_cast<std::int32_t>(root * 1000003 + static_cast<int>(i));
          };
          std::vector<std::int32_t> data(count, -1);
          if (comm.rank() == root)
            for (std::size_t i = 0; i < count; ++i) data[i] = value(i);
          comm.broadcast(data.data(), count, DataType::int32, root);
          for (std::size_t i = 0; i < count; ++i)
            ASSERT_EQ(data[i], value(i)) << "root " << root << " count " << count << " " << i;
        }
      }
    });
  }
}

// Out of place and in place (this rank's block already in the receive buffer).
TEST(Collectives, AllgatherBruckEveryRankCount) {
  ScopedEnv algo("ANVIEW_ALGO", "allgather=bruck");
  for (int n : rank_counts) {
    SCOPED_TRACE(n);
    run_ranks(n, [&](Communicator& comm) {
      ASSERT_EQ(comm.collective_algorithm("allgather", 100), "bruck");
      const auto me = static_cast<std::size_t>(comm.rank());
      for (std::size_t count : counts) {
        const std::size_t total = count * static_cast<std::size_t>(n);
        auto value = [&](std::size_t i) { return static_cast<std::int32_t>(i / count * 7 + i); };
        std::vector<std::int32_t> mine(count), all(total, -1), in_place(total, -1);
        for (std::size_t i = 0; i < count; ++i) {
          mine[i] = value(me * count + i);
          in_place[me * count + i] = mine[i];
        }
        comm.allgather(mine.data(), all.data(), count, DataType::int32);
        comm.allgather(in_place.data() + me * count, in_place.data(), count, DataType::int32);
        for (std::size_t i = 0; i < total; ++i) {
          ASSERT_EQ(all[i], value(i)) << "count " << count << " index " << i;
          ASSERT_EQ(in_place[i], value(i)) << "count " << count << " index " << i;
        }
      }
    });
  }
}

// Runs `call`, which must fail with a usage error whose message holds each of `words`.
void expect_usage_error(const std::function<void()>& call,
                        std::initializer_list<std::string_view> words) {
  try {
    call();
    ADD_FAILURE() << "no usage error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::usage) << e.what();
    for (const auto word : words)
      EXPECT_NE(std::string_view(e.what()).find(word), std::string_view::npos) << e.what();
  }
}

TEST(Collectives, ForcedAlgorithmsAreReportedAndUnknownOnesAreUsageErrors) {
  {
    ScopedEnv algo("ANVIEW_ALGO", "allreduce=rabenseifner,broadcast=binomial,allgather=ring");
    run_ranks(2, [](Communicator& comm) {
      std::string why;
      EXPECT_EQ(comm.collective_algorithm("allreduce", 1 << 20, &why), "rabenseifner");
      EXPECT_EQ(comm.collective_algorithm("broadcast", 100, &why), "binomial");
      EXPECT_EQ(why, "forced by ANVIEW_ALGO");
      EXPECT_EQ(comm.collective_algorithm("allgather", 100, &why), "ring");
      EXPECT_EQ(why, "forced by ANVIEW_ALGO");
      // Forced to the message-passing algorithms, small calls skip the shared-memory path.
      std::int32_t x = comm.rank() == 1 ? 5 : 0;
      comm.broadcast(&x, 1, DataType::int32, 1);
      EXPECT_EQ(x, 5);
      std::int32_t both[2] = {-1, -1};
      comm.allgather(&x, both, 1, DataType::int32);
      EXPECT_EQ(both[0], 5);
      EXPECT_EQ(both[1], 5);
    });
  }
  ScopedEnv algo("ANVIEW_ALGO", "broadcast=nope,allgather=nah");
  run_ranks(2, [](Communicator& comm) {
    std::int32_t x[2] = {};
    expect_usage_error([&] { comm.broadcast(x, 1, DataType::int32, 0); },
                       {"broadcast #1", "broadcast=nope", "known: shared, binomial, chain"});
    expect_usage_error([&] { comm.allgather(x, x, 1, DataType::int32); },
                       {"allgather #2", "allgather=nah", "known: shared, ring, bruck"});
  });
}

// Rank 1 is done with the gather at once and closes its communicator; rank 2 comes late. The
// root, still waiting for rank 2, must not take rank 1's goodbye for a failure of the call.
TEST(Collectives, ARankThatFinishedAndLeftDoesNotFailTheOthers) {
  for (const char* transports : {"shm,tcp", "tcp", "inproc"}) {
    SCOPED_TRACE(transports);
    ScopedEnv env("ANVIEW_TRANSPORTS", transports);
    run_ranks(3, [](Communicator& comm) {
      if (comm.rank() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(600));
      const std::int32_t mine = comm.rank();
      std::int32_t all[3] = {-1, -1, -1};
      comm.gather(&mine, all, 1, DataType::int32, 0);
      if (comm.rank() == 0) {
        EXPECT_EQ(all[0], 0);
        EXPECT_EQ(all[1], 1);
        EXPECT_EQ(all[2], 2);
      }
    });
  }
}

TEST(Collectives, AllgatherReduceScatterGatherScatterAlltoall) {
  for (int n : {1, 2, 3, 4, 7}) {
    SCOPED_TRACE(n);
    run_ranks(n, [&](Communicator& comm) {
      const int me = comm.rank();
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{5001}}) {
        const std::size_t total = count * static_cast<std::size_t>(n);
        // allgather: block r holds r's values
        std::vector<std::int32_t> mine(count, me * 10 + 1), all(total, -1);
        comm.allgather(mine.data(), all.data(), count, DataType::int32);
        for (std::size_t i = 0; i < total; ++i)
          ASSERT_EQ(all[i], static_cast<std::int32_t>(i / count) * 10 + 1);
        // reduce_scatter: every rank sends block b filled with b + rank; block me sums up
        std::vector<std::int32_t> blocks(total), reduced(count, -1);
        for (std::size_t i = 0; i < total; ++i)
          blocks[i] = static_cast<std::int32_t>(i / count) + me;
        comm.reduce_scatter(blocks.data(), reduced.data(), count, DataType::int32, ReduceOp::sum);
        for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(reduced[i], n * me + n * (n - 1) / 2);
        // gather / scatter through the last rank
        const int root = n - 1;
        std::vector<std::int32_t> gathered(me == root ? total : 0, -1);
        comm.gather(mine.data(), gathered.data(), count, DataType::int32, root);
        if (me == root) {
          ASSERT_EQ(gathered, all);
        }
        std::vector<std::int32_t> part(count, -1);
        comm.scatter(me == root ? all.data() : nullptr, part.data(), count, DataType::int32, root);
        ASSERT_EQ(part, mine);
        // alltoall: block b from rank r holds r * 1000 + b
        std::vector<std::int32_t> out(total), in(total, -1);
        for (std::size_t i = 0; i < total; ++i)
          out[i] = me * 1000 + static_cast<std::int32_t>(i / count);
        comm.alltoall(out.data(), in.data(), count, DataType::int32);
        for (std::size_t i = 0; i < total; ++i)
          ASSERT_EQ(in[i], static_cast<std::int32_t>(i / count) * 1000 + me);
        comm.barrier();
      }
    });
  }
}

TEST(Collectives, UnsupportedCombinationsAreUsageErrorsAtTheCall) {
  run_ranks(2, [](Communicator& comm) {
    float f[4] = {};
    try {
      comm.allreduce(f, 4, DataType::float32, ReduceOp::band);
      FAIL() << "band on float32 was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::usage);
      EXPECT_NE(std::string(e.what()).find("allreduce #1"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("integer types only"), std::string::npos) << e.what();
    }
    try {
      comm.broadcast(f, 4, DataType::float32, 2);
      FAIL() << "root 2 of 2 ranks was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::usage);
      EXPECT_NE(std::string(e.what()).find("root 2"), std::string::npos) << e.what();
    }
  });
}

TEST(Collectives, MismatchedSizesFailWithAnErrorNamingTheCall) {
  run_ranks(2, [](Communicator& comm) {
    std::vector<float> data(comm.rank() == 0 ? 10 : 20, 1.0f);
    try {
      comm.allreduce(data.data(), data.size(), DataType::float32, ReduceOp::sum);
      FAIL() << "allreduce of 10 against 20 elements succeeded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("allreduce #1"), std::string::npos) << e.what();
      EXPECT_EQ(e.context().peer, 1 - comm.rank()) << e.what();
    }
  });
}

// Where each rank believes it is a broadcast's root (or that another is a reduce's), no rank
// reads another's part of the same-host call: before, each went on with its own data and
// nothing was said. The next call that reads the peers compares the calls in between.
TEST(Collectives, RootsThatDifferOnOneHostAreReportedByTheNextCallThatReads) {
  const ScopedEnv algo("ANVIEW_ALGO", "broadcast=shared,reduce=shared");
  run_ranks(2, [](Communicator& comm) {
    std::int32_t x = comm.rank();
    comm.broadcast(&x, 1, DataType::int32, comm.rank());  // each its own root
    expect_usage_error([&] { comm.barrier(); },
                       {"same-host collective #1", "broadcast of 4 uint8 from root 0",
                        "broadcast of 4 uint8 from root 1"});
  });
}

// A broadcast's root reads nothing from its peers: before it reuses its line of 16 calls ago
// it needs each peer to have published that call, nothing more. It used to wait, within the
// one call's timeout, for the peer to be 7 calls further (to look less often), and failed a
// peer that kept up with every call. Here the first call (which agrees on the placement) holds
// rank 0 until rank 1 comes at 200 ms; rank 0 is at call 17 right after, where it needs rank
// 1's call 2 (at 400 ms) but waited for its call 9 (at 1800 ms), past the 1 s timeout.
TEST(Collectives, ABroadcastRootFarAheadWaitsOnlyForTheCallItReuses) {
  const ScopedEnv algo("ANVIEW_ALGO", "broadcast=shared");
  run_ranks(
      2,
      [](Communicator& comm) {
        for (std::int32_t i = 0; i < 17; ++i) {
          std::int32_t x = comm.rank() == 0 ? i : -1;
          if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
          comm.broadcast(&x, 1, DataType::int32, 0);
          ASSERT_EQ(x, i) << "broadcast #" << i + 1 << " on rank " << comm.rank();
        }
      },
      std::chrono::seconds(1));
}

// A rank whose call fails its own argument checks (a usage error on that rank alone) took a
// call number but no same-host one. Its next call must not pass for the call its peer is in:
// with the same arguments, each rank used to reduce the other's call and return success (11
// on both here), and every later call paired with the wrong one.
TEST(Collectives, TheCallAfterOneOnlyThisRankRefusedIsNotTakenForThePeersCall) {
  const ScopedEnv algo("ANVIEW_ALGO", "allreduce=shared");
  run_ranks(
      2,
      [](Communicator& comm) {
        float value = 1.0f;
        comm.allreduce(&value, 1, DataType::float32, ReduceOp::sum);  // the first call's setup
        ASSERT_EQ(value, 2.0f);
        value = comm.rank() == 0 ? 10.0f : 1.0f;
        if (comm.rank() == 0) {
          EXPECT_THROW(comm.allreduce(nullptr, 1, DataType::float32, ReduceOp::sum), Error);
        }
        expect_usage_error(
            [&] { comm.allreduce(&value, 1, DataType::float32, ReduceOp::sum); },
            {"allreduce of 1 float32 sum as its collective call #", "in the same order"});
      },
      std::chrono::seconds(5));
}

// Nor does a run of such calls go on for good: a rank compares a peer's earlier calls where
// it looks how far the peer got, before it writes over its own lines of them (a ring of 16).
TEST(Collectives, ARunOfReducesWithoutTheirRootIsReportedWithinARingOfCalls) {
  const ScopedEnv algo("ANVIEW_ALGO", "reduce=shared");
  run_ranks(2, [](Communicator& comm) {
    const std::int64_t mine = 1;
    std::int64_t sum = 0;
    int calls = 0;
    try {
      for (; calls < 64; ++calls)
        comm.reduce(&mine, &sum, 1, DataType::int64, ReduceOp::sum, 1 - comm.rank());
      ADD_FAILURE() << "64 reduces, each rank naming the other its root, were not reported";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::usage) << e.what();
      EXPECT_NE(std::string(e.what()).find("reduce of 1 int64 sum to root 0"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("reduce of 1 int64 sum to root 1"), std::string::npos)
          << e.what();
      EXPECT_LE(calls, 32) << e.what();
    }
  });
}

}  // namespace
}  // namespace anview

namespace anview {
namespace {

TEST(Collectives, SplitMakesIndependentCommunicatorsOrderedByKey) {
  run_ranks(5, [](Communicator& comm) {
    const int color = comm.rank() % 2;                   // evens: 0 2 4, odds: 1 3
    Communicator sub = comm.split(color, -comm.rank());  // reverse order inside each group
    const int members = color == 0 ? 3 : 2;
    ASSERT_EQ(sub.size(), members);
    // Largest old rank first: rank 4 -> 0, 2 -> 1, 0 -> 2; rank 3 -> 0, 1 -> 1.
    const int expected_rank = (color == 0 ? 4 - comm.rank() : 3 - comm.rank()) / 2;
    EXPECT_EQ(sub.rank(), expected_rank);
    std::int64_t value = comm.rank();
    sub.allreduce(&value, 1, DataType::int64, ReduceOp::sum);
    EXPECT_EQ(value, color == 0 ? 0 + 2 + 4 : 1 + 3);
    // The parent goes on working, with its own sequence of collectives.
    std::int64_t all = 1;
    comm.allreduce(&all, 1, DataType::int64, ReduceOp::sum);
    EXPECT_EQ(all, 5);
    // Point-to-point in the sub-communicator uses its own ranks.
    if (sub.size() > 1) {
      int token = sub.rank();
      const int next = (sub.rank() + 1) % sub.size();
      const int prev = (sub.rank() + sub.size() - 1) % sub.size();
      Request r = sub.irecv(&value, sizeof value, prev, Tag{3});
      sub.send(&token, sizeof token, next, Tag{3});
      r.wait();
    }
    EXPECT_THROW(comm.split(-1, 0), Error);
  });
}

}  // namespace
}  // namespace anview
