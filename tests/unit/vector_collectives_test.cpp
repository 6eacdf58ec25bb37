// The v-collectives (allgatherv, gatherv, scatterv, alltoallv) on thread-per-rank communicators:
// per-rank counts including zero, with and without displacements (gaps between blocks stay
// untouched), every root; argument errors at the call; counts that disagree between ranks are
// an Error naming the peer.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "support/thread_ranks.hpp"

namespace anview {
namespace {

using testing::run_ranks;

constexpr std::int32_t untouched = -7;

// Rank r's block: count_of(r) elements (one rank has none).
std::size_t count_of(int r) {
  return static_cast<std::size_t>((r * 3 + 1) % 4);
}
std::int32_t value(int from, int to, std::size_t i) {
  return from * 1000 + to * 100 + static_cast<std::int32_t>(i);
}

struct Layout {
  std::vector<std::size_t> counts, displs;
  std::size_t total = 0;
};

// Blocks of count(r) elements; with gaps, block r starts r elements after the previous one's
// end; without, displacements are left empty (packed).
template <typename Count>
Layout layout(int n, bool gaps, Count count) {
  Layout l;
  for (int r = 0; r < n; ++r) {
    l.counts.push_back(count(r));
    const std::size_t at = l.total + (gaps ? static_cast<std::size_t>(r) : 0);
    if (gaps) l.displs.push_back(at);
    l.total = at + l.counts.back();
  }
  return l;
}

std::size_t at(const Layout& l, int r) {
  if (!l.displs.empty()) return l.displs[static_cast<std::size_t>(r)];
  std::size_t offset = 0;
  for (int k = 0; k < r; ++k) offset += l.counts[static_cast<std::size_t>(k)];
  return offset;
}

// Every element of `buf`: block r holds want(r, i); everything else is untouched.
template <typename Want>
void expect_blocks(const std::vector<std::int32_t>& buf, const Layout& l, Want want) {
  std::vector<bool> covered(buf.size(), false);
  for (std::size_t r = 0; r < l.counts.size(); ++r) {
    const std::size_t base = at(l, static_cast<int>(r));
    for (std::size_t i = 0; i < l.counts[r]; ++i) {
      ASSERT_EQ(buf[base + i], want(static_cast<int>(r), i)) << "block " << r << " element " << i;
      covered[base + i] = true;
    }
  }
  for (std::size_t k = 0; k < buf.size(); ++k) {
    if (!covered[k]) {
      ASSERT_EQ(buf[k], untouched) << "gap element " << k << " was written";
    }
  }
}

TEST(VectorCollectives, AllgathervGathervScattervEveryRankCountAndRoot) {
  for (int n : {1, 2, 3, 5}) {
    for (bool gaps : {false, true}) {
      SCOPED_TRACE(std::to_string(n) + (gaps ? " ranks, gaps" : " ranks, packed"));
      run_ranks(n, [&](Communicator& comm) {
        const int me = comm.rank();
        const Layout l = layout(n, gaps, count_of);
        std::vector<std::int32_t> mine(count_of(me));
        for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = value(me, 0, i);

        std::vector<std::int32_t> all(l.total, untouched);
        comm.allgatherv(mine.data(), mine.size(), all.data(), l.counts, l.displs, DataType::int32);
        expect_blocks(all, l, [](int r, std::size_t i) { return value(r, 0, i); });

        for (int root = 0; root < n; ++root) {
          std::vector<std::int32_t> gathered(me == root ? l.total : 0, untouched);
          comm.gatherv(mine.data(), mine.size(), gathered.data(), l.counts, l.displs,
                       DataType::int32, root);
          if (me == root)
            expect_blocks(gathered, l, [](int r, std::size_t i) { return value(r, 0, i); });

          std::vector<std::int32_t> source(me == root ? l.total : 0, untouched);
          for (int r = 0; r < n && me == root; ++r)
            for (std::size_t i = 0; i < l.counts[static_cast<std::size_t>(r)]; ++i)
              source[at(l, r) + i] = value(root, r, i);
          std::vector<std::int32_t> part(count_of(me), untouched);
          comm.scatterv(source.data(), l.counts, l.displs, part.data(), part.size(),
                        DataType::int32, root);
          for (std::size_t i = 0; i < part.size(); ++i) {
            ASSERT_EQ(part[i], value(root, me, i));
          }
        }
      });
    }
  }
}

// A rank's contribution passed in the receive buffer itself, over the place its block goes
// (here rank 1 sends elements 0-3 of the buffer, and its block is 2-5): it is moved, not
// copied over itself (memcpy of overlapping ranges, which ASan reports).
TEST(VectorCollectives, AllgathervWithTheContributionOverlappingItsOwnBlock) {
  run_ranks(2, [](Communicator& comm) {
    const std::vector<std::size_t> counts = {2, 4};
    const std::vector<std::size_t> displs = {0, 2};
    std::vector<std::int32_t> all(6, -1);
    const std::size_t mine = counts[static_cast<std::size_t>(comm.rank())];
    for (std::size_t i = 0; i < mine; ++i) all[i] = 10 * comm.rank() + static_cast<std::int32_t>(i);
    comm.allgatherv(all.data(), mine, all.data(), counts, displs, DataType::int32);
    EXPECT_EQ(all, (std::vector<std::int32_t>{0, 1, 10, 11, 12, 13}));
  });
}

TEST(VectorCollectives, AlltoallvEveryPair) {
  for (int n : {1, 2, 3, 4}) {
    for (bool gaps : {false, true}) {
      SCOPED_TRACE(std::to_string(n) + (gaps ? " ranks, gaps" : " ranks, packed"));
      run_ranks(n, [&](Communicator& comm) {
        const int me = comm.rank();
        // What rank a sends rank b: (a + 2b) % 3 elements (zero for some pairs).
        auto pair_count = [](int a, int b) { return static_cast<std::size_t>((a + 2 * b) % 3); };
        const Layout s = layout(n, gaps, [&](int to) { return pair_count(me, to); });
        const Layout r = layout(n, gaps, [&](int from) { return pair_count(from, me); });
        std::vector<std::int32_t> send(s.total, untouched), recv(r.total, untouched);
        for (int to = 0; to < n; ++to)
          for (std::size_t i = 0; i < s.counts[static_cast<std::size_t>(to)]; ++i)
            send[at(s, to) + i] = value(me, to, i);
        comm.alltoallv(send.data(), s.counts, s.displs, recv.data(), r.counts, r.displs,
                       DataType::int32);
        expect_blocks(recv, r, [&](int from, std::size_t i) { return value(from, me, i); });
      });
    }
  }
}

TEST(VectorCollectives, BadArgumentsAreUsageErrorsAtTheCall) {
  run_ranks(2, [&](Communicator& comm) {
    std::vector<std::int32_t> buf(8);
    const std::vector<std::size_t> one = {1};
    const std::vector<std::size_t> counts = {1, 1};
    auto expect_usage = [&](auto&& call, const char* what) {
      try {
        call();
        ADD_FAILURE() << what << " succeeded";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::usage) << what << ": " << e.what();
      }
    };
    expect_usage([&] { comm.allgatherv(buf.data(), 1, buf.data(), one, {}, DataType::int32); },
                 "a count list shorter than the communicator");
    expect_usage([&] { comm.allgatherv(buf.data(), 2, buf.data(), counts, {}, DataType::int32); },
                 "a send count other than this rank's receive count");
    expect_usage(
        [&] { comm.alltoallv(buf.data(), counts, {}, buf.data(), counts, {}, DataType::int32); },
        "alltoallv in place");
    // The communicator goes on.
    std::vector<std::int32_t> all(2);
    const std::int32_t mine = comm.rank();
    comm.allgatherv(&mine, 1, all.data(), counts, {}, DataType::int32);
    EXPECT_EQ(all, (std::vector<std::int32_t>{0, 1}));
  });
}

TEST(VectorCollectives, CountsThatDisagreeBetweenRanksNameThePeer) {
  run_ranks(2, [&](Communicator& comm) {
    // Rank 1 sends 3 elements; rank 0 expects 2 from it.
    const std::vector<std::size_t> counts =
        comm.rank() == 0 ? std::vector<std::size_t>{1, 2} : std::vector<std::size_t>{1, 3};
    std::vector<std::int32_t> mine(counts[static_cast<std::size_t>(comm.rank())], 5);
    std::vector<std::int32_t> all(4);
    try {
      comm.allgatherv(mine.data(), mine.size(), all.data(), counts, {}, DataType::int32);
      EXPECT_EQ(comm.rank(), 1) << "rank 0 took 3 elements where it expected 2";
    } catch (const Error& e) {
      EXPECT_EQ(comm.rank(), 0) << e.what();
      EXPECT_EQ(e.context().peer, 1) << e.what();
    }
  });
}

}  // namespace
}  // namespace anview
