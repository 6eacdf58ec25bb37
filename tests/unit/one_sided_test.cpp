// One-sided put/get/flush, thread-per-rank, on every path: shm with cross-memory attach
// (direct), shm without it and TCP (emulated with frames), in-process, a rank to itself, and
// UCX's native RMA between ranks on separate emulated hosts (over UCX's TCP: ranks on other
// hosts cannot use its shared memory, and same-host ranks take the direct paths).
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include <nlohmann/json.hpp>

#include "anview/metrics.hpp"
#include "support/expect_error.hpp"
#include "support/scoped_env.hpp"
#include "support/thread_ranks.hpp"

namespace anview {
namespace {

using anview::testing::expect_error;
using anview::testing::make_payload;
using anview::testing::payload_ok;
using anview::testing::run_ranks;
using anview::testing::ScopedEnv;
using namespace std::chrono_literals;

struct Path {
  const char* name;
  const char* transports;
  const char* cma;
  const char* ucx_tls = "";  // set: UCX's RMA (ANVIEW_UCX_RMA=native) over these UCX devices,
                             // each rank on a host of its own
};

class OneSided : public ::testing::TestWithParam<Path> {
 protected:
  bool native() const { return *GetParam().ucx_tls != '\0'; }
  // run_ranks, with a host per rank on the native paths.
  void run(int ranks, const std::function<void(Communicator&)>& fn) {
    if (!native()) return run_ranks(ranks, fn);
    run_ranks(ranks, fn, std::chrono::seconds(20),
              [](int r) { return "host" + std::to_string(r); });
  }

  ScopedEnv transports_{"ANVIEW_TRANSPORTS", GetParam().transports};
  ScopedEnv cma_{"ANVIEW_SHM_CMA", GetParam().cma};
  ScopedEnv tls_{"UCX_TLS", native() ? GetParam().ucx_tls : "all"};
  ScopedEnv rma_{"ANVIEW_UCX_RMA", native() ? "native" : "auto"};
};

// This rank's puts and gets that went through the transport's native path, so far.
double native_operations(const Communicator& comm) {
  const auto j = nlohmann::json::parse(anview::metrics_json());
  double total = 0;
  for (const auto& m : j["metrics"])
    if (m["name"] == "anview_rma_native_operations_total" &&
        m["labels"].value("rank", "") == std::to_string(comm.rank()))
      total += m["value"].get<double>();
  return total;
}

// Waits until every other rank is past its puts into this rank's memory. A barrier would do,
// but ThreadSanitizer cannot follow its same-host path (flags in shared memory that each rank
// maps at its own address) and would report the reads that follow as races: messages hand
// over under the messenger's lock, which it does follow.
void others_are_done(Communicator& comm) {
  const char token = 1;
  char in = 0;
  for (int r = 0; r < comm.size(); ++r)
    if (r != comm.rank()) comm.send(&token, 1, r, Tag{99});
  for (int r = 0; r < comm.size(); ++r)
    if (r != comm.rank()) comm.recv(&in, 1, r, Tag{99});
}

// Every rank's key, through an allgather of the packed bytes.
std::vector<RemoteKey> exchange_keys(Communicator& comm, const MemoryRegion& region) {
  const auto mine = region.key().pack();
  std::vector<std::byte> all(RemoteKey::packed_bytes * static_cast<std::size_t>(comm.size()));
  comm.allgather(mine.data(), all.data(), mine.size(), DataType::uint8);
  std::vector<RemoteKey> keys;
  for (int r = 0; r < comm.size(); ++r) {
    keys.push_back(RemoteKey::unpack(std::span<const std::byte>(
        all.data() + RemoteKey::packed_bytes * static_cast<std::size_t>(r),
        RemoteKey::packed_bytes)));
  }
  return keys;
}

TEST_P(OneSided, PutThenGetEverySizeClass) {
  const std::vector<std::size_t> sizes = {1, 8, 4096, 65537, (1u << 20) + 3, 5u << 20};
  run(3, [&](Communicator& comm) {
    constexpr std::size_t slot = 6u << 20;
    std::vector<unsigned char> memory(slot * static_cast<std::size_t>(comm.size()), 0);
    MemoryRegion region = comm.register_memory(memory.data(), memory.size());
    const auto keys = exchange_keys(comm, region);
    const int next = (comm.rank() + 1) % comm.size();
    for (std::size_t m = 0; m < sizes.size(); ++m) {
      // Each rank writes its own slot of the next rank's region, then reads it back.
      const auto out = make_payload(comm.rank(), m, sizes[m]);
      const std::uint64_t offset = slot * static_cast<std::size_t>(comm.rank()) + m;
      comm.put(out.data(), out.size(), keys[static_cast<std::size_t>(next)], offset).wait();
      comm.flush(next).wait();
      std::vector<unsigned char> back(sizes[m]);
      const Status s =
          comm.get(back.data(), back.size(), keys[static_cast<std::size_t>(next)], offset).wait();
      EXPECT_EQ(s.bytes, sizes[m]);
      EXPECT_TRUE(payload_ok(back.data(), comm.rank(), m, sizes[m])) << "size " << sizes[m];
      others_are_done(comm);
      const int prev = (comm.rank() + comm.size() - 1) % comm.size();
      EXPECT_TRUE(
          payload_ok(memory.data() + slot * static_cast<std::size_t>(prev) + m, prev, m, sizes[m]))
          << "what rank " << prev << " put, size " << sizes[m];
      others_are_done(comm);
    }
  });
}

TEST_P(OneSided, AllocatedRegionsWorkLikeRegisteredOnes) {
  run(2, [&](Communicator& comm) {
    constexpr std::size_t bytes = 3u << 20;
    MemoryRegion region = comm.allocate_memory(bytes);
    ASSERT_EQ(region.size(), bytes);
    auto* memory = static_cast<unsigned char*>(region.data());
    EXPECT_EQ(memory[0], 0);  // zeroed
    EXPECT_EQ(memory[bytes - 1], 0);
    const auto keys = exchange_keys(comm, region);
    const int peer = 1 - comm.rank();
    const auto& target = keys[static_cast<std::size_t>(peer)];
    EXPECT_GE(target.fd, 0);
    for (std::size_t size : {std::size_t{1}, std::size_t{100000}, bytes - 7}) {
      const auto out = make_payload(comm.rank(), size, size);
      comm.put(out.data(), out.size(), target, 7).wait();
      comm.flush(peer).wait();
      std::vector<unsigned char> back(size);
      comm.get(back.data(), back.size(), target, 7).wait();
      EXPECT_TRUE(payload_ok(back.data(), comm.rank(), size, size)) << size;
      others_are_done(comm);
      EXPECT_TRUE(payload_ok(memory + 7, peer, size, size)) << size;
      others_are_done(comm);
    }
    // Deregistered (and freed): the peer's put is refused, even through a mapping it holds.
    region.deregister();
    others_are_done(comm);
    const unsigned char byte = 1;
    const Error stale = expect_error([&] { comm.put(&byte, 1, target, 0).wait(); });
    EXPECT_EQ(stale.kind(), ErrorKind::usage);
    EXPECT_EQ(stale.peer(), peer);
    EXPECT_EQ(expect_error([&] { comm.flush(peer).wait(); }).kind(), ErrorKind::usage);
    others_are_done(comm);
  });
}

TEST_P(OneSided, ManyOutstandingPutsThenOneFlush) {
  run(2, [&](Communicator& comm) {
    constexpr std::size_t count = 2000;
    std::vector<std::uint64_t> memory(count, 0);
    MemoryRegion region = comm.register_memory(memory.data(), memory.size() * 8);
    const auto keys = exchange_keys(comm, region);
    const int peer = 1 - comm.rank();
    std::vector<std::uint64_t> values(count);
    std::vector<Request> puts;
    for (std::size_t i = 0; i < count; ++i) {
      values[i] = (static_cast<std::uint64_t>(comm.rank()) << 32) | i;
      puts.push_back(comm.put(&values[i], 8, keys[static_cast<std::size_t>(peer)], i * 8));
    }
    comm.flush(peer).wait();
    for (auto& p : puts) EXPECT_TRUE(p.done());
    std::vector<std::uint64_t> back(count);
    comm.get(back.data(), back.size() * 8, keys[static_cast<std::size_t>(peer)]).wait();
    EXPECT_EQ(back, values);
    others_are_done(comm);
    for (std::size_t i = 0; i < count; ++i)
      ASSERT_EQ(memory[i], (static_cast<std::uint64_t>(peer) << 32) | i);
    others_are_done(comm);
  });
}

TEST_P(OneSided, OwnerServesWithoutMakingAnyCall) {
  std::atomic<bool> finished{false};
  run(2, [&](Communicator& comm) {
    std::vector<unsigned char> memory(3u << 20);
    for (std::size_t i = 0; i < memory.size(); ++i) memory[i] = static_cast<unsigned char>(i * 7);
    MemoryRegion region = comm.register_memory(memory.data(), memory.size());
    const auto keys = exchange_keys(comm, region);
    if (comm.rank() == 0) {
      // Busy elsewhere: no Anview call until the peer is done (or gives up).
      const auto give_up = std::chrono::steady_clock::now() + 20s;
      while (!finished.load() && std::chrono::steady_clock::now() < give_up)
        std::this_thread::sleep_for(1ms);
      EXPECT_TRUE(finished.load());
    } else {
      std::vector<unsigned char> got(memory.size());
      comm.get(got.data(), got.size(), keys[0]).wait(10s);
      for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(got[i], static_cast<unsigned char>(i * 7)) << i;
      const unsigned char byte = 0xAB;
      comm.put(&byte, 1, keys[0], 5).wait(10s);
      comm.flush(0).wait(10s);
      finished.store(true);
    }
    others_are_done(comm);
    EXPECT_EQ(memory[5], comm.rank() == 0 ? 0xAB : 5 * 7);
  });
}

TEST_P(OneSided, RangesOutsideTheRegionFailAtTheCall) {
  run(2, [&](Communicator& comm) {
    std::vector<unsigned char> memory(100, 0x11);
    MemoryRegion region = comm.register_memory(memory.data(), memory.size());
    const auto keys = exchange_keys(comm, region);
    const RemoteKey& other = keys[static_cast<std::size_t>(1 - comm.rank())];
    unsigned char buffer[64] = {};
    const Error past_end = expect_error([&] { comm.put(buffer, 10, other, 95); });
    EXPECT_EQ(past_end.kind(), ErrorKind::usage);
    EXPECT_EQ(past_end.operation(), "put");
    EXPECT_NE(past_end.cause().find("outside the region of 100 bytes"), std::string::npos)
        << past_end.what();
    const Error huge = expect_error([&] { comm.get(buffer, 64, other, ~std::uint64_t{0}); });
    EXPECT_EQ(huge.kind(), ErrorKind::usage);
    EXPECT_EQ(huge.operation(), "get");
    RemoteKey elsewhere = other;
    elsewhere.rank = 7;
    EXPECT_EQ(expect_error([&] { comm.put(buffer, 1, elsewhere); }).kind(), ErrorKind::usage);
    EXPECT_EQ(expect_error([&] { comm.put(buffer, 1, RemoteKey{.rank = 0}); }).kind(),
              ErrorKind::usage);
    others_are_done(comm);
    for (unsigned char b : memory) ASSERT_EQ(b, 0x11);  // nothing was written
  });
}

TEST_P(OneSided, StaleKeysAreRejectedAndNothingIsWritten) {
  run(2, [&](Communicator& comm) {
    std::vector<unsigned char> memory(1u << 20, 0x22);
    MemoryRegion region = comm.register_memory(memory.data(), memory.size());
    const auto keys = exchange_keys(comm, region);
    region.deregister();
    EXPECT_FALSE(region.valid());
    // A new region on the same memory has a new key: the old one stays stale.
    MemoryRegion again = comm.register_memory(memory.data(), memory.size());
    others_are_done(comm);
    const int peer = 1 - comm.rank();
    const std::vector<unsigned char> out(300000, 0x99);
    const Error put_error = expect_error(
        [&] { comm.put(out.data(), out.size(), keys[static_cast<std::size_t>(peer)]).wait(); });
    EXPECT_EQ(put_error.kind(), ErrorKind::usage);
    EXPECT_EQ(put_error.peer(), peer);
    EXPECT_NE(put_error.cause().find("no region registered under this key"), std::string::npos)
        << put_error.what();
    std::vector<unsigned char> in(1000, 0x33);
    const Error get_error = expect_error(
        [&] { comm.get(in.data(), in.size(), keys[static_cast<std::size_t>(peer)]).wait(); });
    EXPECT_EQ(get_error.kind(), ErrorKind::usage);
    EXPECT_EQ(get_error.operation(), "get");
    others_are_done(comm);
    for (unsigned char b : memory) ASSERT_EQ(b, 0x22);  // nothing was written
  });
}

TEST_P(OneSided, AFlushReportsTheFailureOfAnOperationItCovers) {
  run(2, [&](Communicator& comm) {
    std::vector<unsigned char> memory(4096, 0);
    MemoryRegion region = comm.register_memory(memory.data(), memory.size());
    const auto keys = exchange_keys(comm, region);
    region.deregister();
    others_are_done(comm);
    const int peer = 1 - comm.rank();
    const unsigned char byte = 1;
    Request put = comm.put(&byte, 1, keys[static_cast<std::size_t>(peer)], 10);
    Request flush = comm.flush();
    EXPECT_EQ(expect_error([&] { flush.wait(); }).kind(), ErrorKind::usage);
    EXPECT_EQ(expect_error([&] { put.wait(); }).kind(), ErrorKind::usage);
    others_are_done(comm);
  });
}

// A put refused at its first chunk (a stale key) completes only once the transport has let go
// of all its chunks: the caller frees the 8 MiB buffer as soon as wait() returns. Before, the
// refusal completed it while later chunks still waited in the transport's queue, pointing
// into the buffer (ASan: heap-use-after-free in the shm ring's copy, on the emulated paths).
TEST_P(OneSided, ARefusedPutLetsGoOfItsBufferBeforeItCompletes) {
  run(2, [&](Communicator& comm) {
    std::vector<unsigned char> memory(4096, 0);
    MemoryRegion region = comm.register_memory(memory.data(), memory.size());
    auto keys = exchange_keys(comm, region);
    region.deregister();
    others_are_done(comm);
    const int peer = 1 - comm.rank();
    RemoteKey stale = keys[static_cast<std::size_t>(peer)];
    stale.bytes = 8u << 20;  // so the initiator's range check passes
    {
      auto out = std::make_unique<std::vector<unsigned char>>(stale.bytes, 0x99);
      const Error e = expect_error([&] { comm.put(out->data(), out->size(), stale).wait(); });
      EXPECT_EQ(e.kind(), ErrorKind::usage) << e.what();
    }  // the buffer is freed
    EXPECT_EQ(expect_error([&] { comm.flush().wait(); }).kind(), ErrorKind::usage);
    others_are_done(comm);  // the transports go on moving whatever they still hold
    for (unsigned char b : memory) ASSERT_EQ(b, 0);
  });
}

// A key whose size the caller enlarged is refused on every path, and nothing is written. On
// the mapped path (an allocated region under cross-memory attach) the initiator trusted the
// key's size once it had mapped the region: a put past the region's end wrote past the end of
// its own mapping (a crash, or another mapping's memory).
TEST_P(OneSided, AKeyEnlargedByTheCallerIsRefusedAndNothingIsWritten) {
  run(2, [&](Communicator& comm) {
    MemoryRegion region = comm.allocate_memory(4096);
    std::memset(region.data(), 0x22, 4096);
    const auto keys = exchange_keys(comm, region);
    others_are_done(comm);
    const int peer = 1 - comm.rank();
    const RemoteKey& key = keys[static_cast<std::size_t>(peer)];
    const std::vector<unsigned char> out(1u << 20, 0x99);
    comm.put(out.data(), 8, key, 0).wait();  // maps the region where it can
    for (const std::uint64_t bytes : {std::uint64_t{8192}, std::uint64_t{1} << 20}) {
      RemoteKey enlarged = key;
      enlarged.bytes = bytes;
      const Error e =
          expect_error([&] { comm.put(out.data(), bytes - 4096, enlarged, 4096).wait(); });
      EXPECT_EQ(e.kind(), ErrorKind::usage) << e.what();
    }
    EXPECT_EQ(expect_error([&] { comm.flush().wait(); }).kind(), ErrorKind::usage);
    others_are_done(comm);
    const auto* mine = static_cast<const unsigned char*>(region.data());
    for (std::size_t i = 0; i < 4096; ++i) ASSERT_EQ(mine[i], i < 8 ? 0x99 : 0x22) << i;
  });
}

// A key is good in the communicator that made it only (docs/one-sided.md). The frame paths
// look the token up in that communicator's table; the direct and mapped paths read the owner's
// record or segment header, which named no communicator: they accepted another one's key.
TEST_P(OneSided, AKeyOfAnotherCommunicatorIsRefusedAndNothingIsWritten) {
  run(2, [&](Communicator& comm) {
    Communicator other = comm.split(0, comm.rank());
    std::vector<unsigned char> registered(4096, 0x22);
    MemoryRegion regions[] = {other.register_memory(registered.data(), registered.size()),
                              other.allocate_memory(4096)};
    std::memset(regions[1].data(), 0x22, 4096);
    const int peer = 1 - comm.rank();
    const std::vector<unsigned char> out(4096, 0x99);
    std::vector<unsigned char> back(4096, 0);
    for (const MemoryRegion& region : regions) {
      const RemoteKey key = exchange_keys(other, region)[static_cast<std::size_t>(peer)];
      const Error put = expect_error([&] { comm.put(out.data(), out.size(), key, 0).wait(); });
      EXPECT_EQ(put.kind(), ErrorKind::usage) << put.what();
      EXPECT_EQ(expect_error([&] { comm.flush(peer).wait(); }).kind(), ErrorKind::usage);
      const Error get = expect_error([&] { comm.get(back.data(), back.size(), key, 0).wait(); });
      EXPECT_EQ(get.kind(), ErrorKind::usage) << get.what();
      EXPECT_EQ(expect_error([&] { comm.flush(peer).wait(); }).kind(), ErrorKind::usage);
      // Where gets are served by the owner's progress, the peer's may still wait for ours.
      others_are_done(comm);
      // Its own communicator takes it.
      other.get(back.data(), back.size(), key, 0).wait();
      EXPECT_EQ(back, std::vector<unsigned char>(4096, 0x22));
    }
    others_are_done(comm);
    for (const MemoryRegion& region : regions) {
      const auto* mine = static_cast<const unsigned char*>(region.data());
      for (std::size_t i = 0; i < 4096; ++i) ASSERT_EQ(mine[i], 0x22) << i;
    }
    others_are_done(comm);
  });
}

TEST_P(OneSided, ARankReachesItsOwnRegion) {
  run(1, [&](Communicator& comm) {
    std::vector<unsigned char> memory(1000, 0);
    MemoryRegion region = comm.register_memory(memory.data(), memory.size());
    const auto data = make_payload(0, 1, 500);
    comm.put(data.data(), data.size(), region.key(), 250).wait();
    EXPECT_TRUE(payload_ok(memory.data() + 250, 0, 1, 500));
    std::vector<unsigned char> back(500);
    comm.get(back.data(), back.size(), region.key(), 250).wait();
    EXPECT_EQ(back, data);
    const RemoteKey key = region.key();
    region.deregister();
    EXPECT_EQ(expect_error([&] { comm.get(back.data(), 1, key).wait(); }).kind(), ErrorKind::usage);
    // The next flush reports that failure too, once.
    EXPECT_EQ(expect_error([&] { comm.flush().wait(); }).kind(), ErrorKind::usage);
    comm.flush().wait();
  });
}

TEST_P(OneSided, DeregisteringWithdrawsAKeyInUse) {
  // Rank 1 writes into rank 0's region, which then goes away while rank 1 still holds its key
  // (natively: the owner has every holder drop the key and flush before it releases the
  // registration). Rank 1's next put is refused, and nothing more is written.
  run(2, [&](Communicator& comm) {
    std::vector<unsigned char> memory(1u << 20, 0x44);
    MemoryRegion region = comm.register_memory(memory.data(), memory.size());
    const auto keys = exchange_keys(comm, region);
    const auto out = make_payload(1, 3, 200000);
    if (comm.rank() == 1) {
      comm.put(out.data(), out.size(), keys[0], 100).wait();
      comm.flush(0).wait();
      if (native()) {
        EXPECT_NE(comm.describe_peer(0).find("one-sided: UCX RMA"), std::string::npos)
            << comm.describe_peer(0);
        EXPECT_GE(native_operations(comm), 1.0);
      }
    }
    others_are_done(comm);
    if (comm.rank() == 0) {
      EXPECT_TRUE(payload_ok(memory.data() + 100, 1, 3, out.size()));
      region.deregister();  // rank 1 holds the key (native): withdrawn first
      std::fill(memory.begin(), memory.end(), 0x55);
    }
    others_are_done(comm);
    if (comm.rank() == 1) {
      const Error stale =
          expect_error([&] { comm.put(out.data(), out.size(), keys[0], 100).wait(); });
      EXPECT_EQ(stale.kind(), ErrorKind::usage);
      EXPECT_EQ(stale.peer(), 0);
      EXPECT_NE(stale.cause().find("no region registered under this key"), std::string::npos)
          << stale.what();
      std::vector<unsigned char> in(64);
      EXPECT_EQ(expect_error([&] { comm.get(in.data(), in.size(), keys[0]).wait(); }).kind(),
                ErrorKind::usage);
    }
    others_are_done(comm);
    if (comm.rank() == 0) {
      for (unsigned char b : memory) ASSERT_EQ(b, 0x55);  // nothing written after the release
    }
  });
}

TEST_P(OneSided, DeregisteringGivesUpOnAHolderThatDoesNotAnswer) {
  // Native only: rank 1 holds rank 0's key, then makes no Anview call for a while (and has no
  // background progress: it registered nothing). Rank 0's deregistration waits for the
  // withdrawal up to the communicator's timeout, not forever, and the region is gone after.
  if (!native()) GTEST_SKIP() << "no key to withdraw on this path";
  std::atomic<bool> deregistered{false};
  run_ranks(
      2,
      [&](Communicator& comm) {
        std::vector<unsigned char> memory(4096, 0);
        MemoryRegion region;
        if (comm.rank() == 0) region = comm.register_memory(memory.data(), memory.size());
        std::array<std::byte, RemoteKey::packed_bytes> packed{};
        if (comm.rank() == 0) packed = region.key().pack();
        comm.broadcast(packed.data(), packed.size(), DataType::uint8, 0);
        const RemoteKey key = RemoteKey::unpack(packed);
        if (comm.rank() == 1) {
          const unsigned char byte = 7;
          comm.put(&byte, 1, key, 0).wait();
          comm.flush(0).wait();
          comm.send(&byte, 1, 0, Tag{1});
          while (!deregistered.load()) std::this_thread::sleep_for(10ms);  // no progress here
        } else {
          unsigned char in = 0;
          comm.recv(&in, 1, 1, Tag{1});
          EXPECT_EQ(memory[0], 7);
          const auto start = std::chrono::steady_clock::now();
          region.deregister();
          const auto waited = std::chrono::steady_clock::now() - start;
          deregistered.store(true);
          EXPECT_GE(waited, 1500ms);
          EXPECT_LT(waited, 10s);
        }
        comm.barrier();
      },
      std::chrono::seconds(2), [](int r) { return "host" + std::to_string(r); });
}

INSTANTIATE_TEST_SUITE_P(Paths, OneSided,
                         ::testing::Values(Path{"shm", "shm,tcp", "1"},
                                           Path{"shm_ring", "shm,tcp", "0"},
                                           Path{"tcp", "tcp", "1"}, Path{"inproc", "inproc", "1"}
#if defined(ANVIEW_HAVE_UCX)
                                           ,
                                           Path{"ucx_rma_tcp", "ucx", "1", "tcp"}
#endif
                                           ),
                         [](const auto& p) { return std::string(p.param.name); });

TEST(RemoteKey, PacksAndRefusesGarbage) {
  const RemoteKey key{.rank = 3, .token = 42, .address = 0x1000, .bytes = 77, .record = 0x2000};
  const auto packed = key.pack();
  const RemoteKey back = RemoteKey::unpack(packed);
  EXPECT_EQ(back.rank, 3);
  EXPECT_EQ(back.token, 42u);
  EXPECT_EQ(back.address, 0x1000u);
  EXPECT_EQ(back.bytes, 77u);
  EXPECT_EQ(back.record, 0x2000u);
  auto garbage = packed;
  garbage[0] = std::byte{0};
  EXPECT_EQ(expect_error([&] { RemoteKey::unpack(garbage); }).kind(), ErrorKind::usage);
  EXPECT_EQ(expect_error([&] {
              RemoteKey::unpack(std::span<const std::byte>(packed.data(), 10));
            }).kind(),
            ErrorKind::usage);
}

}  // namespace
}  // namespace anview
