// The shm transport below the p2p layer: the ring's record checks, the published endpoint, and
// whole transports (several ranks in this process, each with its own engine) fed with corrupt
// ring contents, a version mismatch, and a peer that leaves.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.hpp"
#include "base/progress_engine.hpp"
#include "base/shared_segment.hpp"
#include "transport/cross_memory.hpp"
#include "transport/shm/handshake.hpp"
#include "transport/shm/ring.hpp"
#include "transport/shm/shm_transport.hpp"

namespace anview::transport::shm {
namespace {

// A ring in ordinary memory.
struct LocalRing {
  explicit LocalRing(std::size_t capacity) : memory(ring_data_offset + capacity) {
    control = new (memory.data()) RingControl{};
    control->capacity = capacity;
    control->flag_salt = 0x5eed5a17f00dULL;
    control->head.store(0);
    control->tail.store(0);
    writer.attach(control, memory.data() + ring_data_offset, capacity);
    reader.attach(control, memory.data() + ring_data_offset, capacity, control->flag_salt);
  }
  std::vector<char> memory;
  RingControl* control;
  RingWriter writer;
  RingReader reader;
};

TEST(ShmRing, RecordsArriveInOrderAcrossTheWrap) {
  LocalRing ring(64 << 10);
  std::uint64_t written = 0, read = 0;
  auto drain = [&] {  // reads every published record; each holds its sequence number
    RingReader::Record r;
    std::string error;
    while (ring.reader.peek(r, error)) {
      std::uint64_t value;
      std::memcpy(&value, r.body, sizeof value);
      EXPECT_EQ(value, read++);
      ring.reader.pop(r);
    }
    EXPECT_TRUE(error.empty()) << error;
    ring.reader.publish();
  };
  for (int round = 0; round < 2000; ++round) {
    const std::size_t body = 8 + (round * 37) % 3000;
    char* p = ring.writer.reserve(RecordKind::fragment, body);
    if (p == nullptr) {  // full: drain everything
      drain();
      p = ring.writer.reserve(RecordKind::fragment, body);
      ASSERT_NE(p, nullptr);
    }
    std::memcpy(p, &written, sizeof written);
    ++written;
    ring.writer.publish();
  }
  drain();
  EXPECT_EQ(read, written);
  EXPECT_GT(ring.control->head.load(), 64u << 10) << "the test never wrapped the ring";
}

// A record's sequence number is its "ready" flag: the consumer sees nothing of a reserved
// record until publish(), even where the ring's bytes there hold a header from an earlier lap.
TEST(ShmRing, ARecordIsInvisibleUntilPublished) {
  LocalRing ring(4096);
  RingReader::Record r;
  std::string error;
  for (int lap = 0; lap < 3; ++lap) {
    for (std::size_t at = 0; at < 4096; at += 1024) {
      char* p = ring.writer.reserve(RecordKind::fragment, 1024 - sizeof(RecordHeader));
      ASSERT_NE(p, nullptr);
      std::memset(p, lap, 8);
      EXPECT_FALSE(ring.reader.has_data());
      EXPECT_FALSE(ring.reader.peek(r, error));
      ASSERT_TRUE(error.empty()) << error;
      ring.writer.publish();
      EXPECT_TRUE(ring.reader.has_data());
      ASSERT_TRUE(ring.reader.peek(r, error)) << error;
      EXPECT_EQ(r.body, p);
      EXPECT_EQ(r.body[7], lap);
      ring.reader.pop(r);
      ring.reader.publish();
    }
  }
}

// Where the next record will go, the ring may hold an older record's payload; bytes there that
// happen to equal the sequence number due (small integers are common payload) must not pass
// for a record. The fuzzer found it: a payload byte 57 over zeroes, where record 57 was due
// (when the flag was the plain number).
TEST(ShmRing, StalePayloadThatLooksLikeTheDueSequenceNumberIsNoRecord) {
  LocalRing ring(1024);
  RingReader::Record r;
  std::string error;
  auto write_and_read = [&](std::size_t body, std::uint64_t fill) {
    char* p = ring.writer.reserve(RecordKind::fragment, body);
    ASSERT_NE(p, nullptr);
    for (std::size_t at = 0; at + 8 <= body; at += 8) std::memcpy(p + at, &fill, 8);
    ring.writer.publish();
    ASSERT_TRUE(ring.reader.peek(r, error)) << error;
    ring.reader.pop(r);
    ring.reader.publish();
  };
  // Lap 1: record 1 spans offsets 0-191, its payload all 16s; records 2-14 fill the rest.
  write_and_read(192 - sizeof(RecordHeader), 16);
  for (int i = 0; i < 13; ++i) write_and_read(8, 0);
  // Lap 2: record 15 at offset 0; record 16 would go at 64, where record 1's payload says 16.
  write_and_read(8, 0);
  EXPECT_FALSE(ring.reader.has_data());
  EXPECT_FALSE(ring.reader.peek(r, error));
  EXPECT_TRUE(error.empty()) << error;
  write_and_read(8, 0);  // and record 16 itself is read where it is
  EXPECT_TRUE(error.empty()) << error;
}

// The consumer reads a record as soon as it announces itself; the producer stores `head`
// after. A `head` that lags behind what was read is no error, and no data.
TEST(ShmRing, HeadLaggingBehindTheReadRecordsIsNotAnError) {
  LocalRing ring(4096);
  ASSERT_NE(ring.writer.reserve(RecordKind::fragment, 8), nullptr);
  ring.writer.publish();
  ring.control->head.store(0);  // as if the producer had not stored it yet
  RingReader::Record r;
  std::string error;
  ASSERT_TRUE(ring.reader.peek(r, error)) << error;
  ring.reader.pop(r);
  EXPECT_FALSE(ring.reader.has_data());
  EXPECT_FALSE(ring.reader.peek(r, error));
  EXPECT_TRUE(error.empty()) << error;
}

TEST(ShmRing, RejectsCorruptRecords) {
  struct Case {
    const char* name;
    void (*damage)(LocalRing&);
    const char* expect;
  };
  const Case cases[] = {
      {"bad magic", [](LocalRing& r) { r.memory[ring_data_offset] ^= 0x5a; }, "bad record header"},
      {"unknown kind", [](LocalRing& r) { r.memory[ring_data_offset + 2] = 42; }, "kind 42"},
      {"length past the data",
       [](LocalRing& r) {
         const std::uint32_t huge = 1u << 20;
         std::memcpy(&r.memory[ring_data_offset + 4], &huge, sizeof huge);
       },
       "runs past"},
      {"sequence gap",
       [](LocalRing& r) {
         const std::uint64_t seq = 7;
         const std::uint64_t flag = record_flag(seq, r.control->flag_salt);
         std::memcpy(&r.memory[ring_data_offset + record_flag_offset], &flag, sizeof flag);
       },
       "was due"},
      {"head beyond capacity",  // the record not in place, and head announcing too much
       [](LocalRing& r) {
         std::memset(&r.memory[ring_data_offset + record_flag_offset], 0, 8);
         r.control->head.store(1u << 30);
       },
       "inconsistent"},
      {"head announcing a record that is not in place",
       [](LocalRing& r) { std::memset(&r.memory[ring_data_offset + record_flag_offset], 0, 8); },
       "was due"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    LocalRing ring(64 << 10);
    char* p = ring.writer.reserve(RecordKind::fragment, 64);
    ASSERT_NE(p, nullptr);
    ring.writer.publish();
    c.damage(ring);
    RingReader::Record r;
    std::string error;
    EXPECT_FALSE(ring.reader.peek(r, error));
    EXPECT_NE(error.find(c.expect), std::string::npos) << error;
  }
}

TEST(ShmEndpoint, RoundTripsAndRejectsOtherVersions) {
  const Endpoint e{.pid = 1234,
                   .segment_fd = 7,
                   .ring_bytes = 1 << 19,
                   .wake_name = "w-1",
                   .probe_address = 0x7fff0000};
  Endpoint back;
  std::string why;
  ASSERT_TRUE(decode_endpoint(encode_endpoint(e), back, &why)) << why;
  EXPECT_EQ(back.pid, 1234);
  EXPECT_EQ(back.segment_fd, 7);
  EXPECT_EQ(back.ring_bytes, 1u << 19);
  EXPECT_EQ(back.wake_name, "w-1");
  EXPECT_EQ(back.probe_address, 0x7fff0000u);

  const std::string other = "v" + std::to_string(segment_version + 1);
  const std::string ours = "v" + std::to_string(segment_version);
  EXPECT_FALSE(decode_endpoint(other + " pid=1 fd=3 ring=524288 wake=x probe=10", back, &why));
  EXPECT_NE(why.find("version"), std::string::npos) << why;
  EXPECT_FALSE(decode_endpoint(ours + " pid=1 fd=3 ring=1000 wake=x probe=10", back, &why));
  EXPECT_NE(why.find("'ring'"), std::string::npos) << why;
  EXPECT_FALSE(decode_endpoint(ours + " pid=1", back, &why));
  // A field given twice does not stand in for a missing one (here the ring size, which would
  // leave the writer's capacity 0 and its offsets unmasked).
  EXPECT_FALSE(decode_endpoint(ours + " pid=1 fd=3 wake=x probe=1 probe=2", back, &why));
  EXPECT_NE(why.find("repeats the 'probe' field"), std::string::npos) << why;
}

// A FrameSink that records what it is given.
class RecordingSink final : public FrameSink {
 public:
  // Each frame lands in its own buffer: frames may complete out of order.
  Landing on_frame(int, const FrameHeader& h, bool) override {
    auto buffer = std::make_unique<std::vector<char>>(h.payload_bytes + 1);
    char* data = buffer->data();
    landings[data] = std::move(buffer);
    return Landing{data, false};
  }
  void on_frame_done(int peer, const FrameHeader& h, void* data) override {
    auto it = landings.find(static_cast<char*>(data));
    ASSERT_NE(it, landings.end());
    frames.push_back({peer, h.tag, std::string(it->second->data(), h.payload_bytes)});
    landings.erase(it);
  }
  void on_peer_failed(int peer, const Error& error, bool /*left*/) override {
    failures.emplace(peer, std::make_unique<Error>(error));
  }
  struct Frame {
    int peer;
    std::uint64_t tag;
    std::string payload;
  };
  std::map<char*, std::unique_ptr<std::vector<char>>> landings;
  std::vector<Frame> frames;
  std::map<int, std::unique_ptr<Error>> failures;
};

// `n` ranks of one job in this process, each with its own engine and shm transport.
class Ranks {
 public:
  explicit Ranks(int n) : sinks_(static_cast<std::size_t>(n)) {
    for (int r = 0; r < n; ++r) {
      engines_.push_back(std::make_unique<base::ProgressEngine>());
      transports_.push_back(std::make_unique<ShmTransport>(
          TransportContext{.rank = r,
                           .world_size = n,
                           .job_id = 77,
                           .host_id = "this-host",
                           .timeout = std::chrono::seconds(5),
                           .engine = engines_.back().get(),
                           .sink = &sinks_[static_cast<std::size_t>(r)]}));
      PeerInfo info{.rank = r, .host_id = "this-host", .pid = static_cast<int>(::getpid())};
      transports_.back()->describe_self(info);
      infos_.push_back(info);
    }
  }
  void connect() {
    for (int r = 0; r < static_cast<int>(transports_.size()); ++r) connect_rank(r);
    for (int i = 0; i < 1000 && !all_ready(); ++i) poll();
    ASSERT_TRUE(all_ready());
  }
  void connect_rank(int r) {
    std::vector<PeerInfo> others;
    for (const auto& info : infos_)
      if (info.rank != r) others.push_back(info);
    transports_[static_cast<std::size_t>(r)]->connect(others);
  }
  bool all_ready() const {
    for (const auto& t : transports_)
      if (!t->ready()) return false;
    return true;
  }
  void poll() {
    for (auto& e : engines_) e->poll(0);
  }
  void send(int from, int to, std::uint64_t tag, const std::string& payload,
            Ordering ordering = Ordering::ordered, bool* done = nullptr) {
    FrameHeader h;
    h.type = 1;
    h.tag = tag;
    h.payload_bytes = static_cast<std::uint32_t>(payload.size());
    transports_[static_cast<std::size_t>(from)]->post_send(to, h, payload.data(), ordering,
                                                           [done](const Error* e) {
                                                             if (done != nullptr && e == nullptr)
                                                               *done = true;
                                                           });
  }
  // The ring `from` writes to `to`, mapped again by the test (as a hostile local process
  // with the same rights could).
  Mapping map_ring(int from, int to, std::string* why) {
    Endpoint e;
    decode_endpoint(infos_[static_cast<std::size_t>(to)].endpoints.at("shm"), e, why);
    const int fd = open_peer_segment(e.pid, e.segment_fd, why);
    base::Fd owned(fd);
    return map_shared(fd, slot_offset(from, e.ring_bytes), slot_bytes(e.ring_bytes), why);
  }
  // The control page of rank `r`'s segment, mapped again by the test.
  Mapping map_control(int r, std::string* why) {
    Endpoint e;
    decode_endpoint(infos_[static_cast<std::size_t>(r)].endpoints.at("shm"), e, why);
    const int fd = open_peer_segment(e.pid, e.segment_fd, why);
    base::Fd owned(fd);
    return map_shared(fd, 0, page_bytes, why);
  }
  // map_ring(), failing the test (and mapping nothing) on an error.
  Mapping ring(int from, int to) {
    std::string why;
    Mapping mapped = map_ring(from, to, &why);
    EXPECT_TRUE(mapped) << why;
    return mapped;
  }
  RecordingSink& sink(int r) { return sinks_[static_cast<std::size_t>(r)]; }
  ShmTransport& transport(int r) { return *transports_[static_cast<std::size_t>(r)]; }
  base::ProgressEngine& engine(int r) { return *engines_[static_cast<std::size_t>(r)]; }
  PeerInfo& info(int r) { return infos_[static_cast<std::size_t>(r)]; }

 private:
  std::vector<RecordingSink> sinks_;
  std::vector<std::unique_ptr<base::ProgressEngine>> engines_;
  std::vector<std::unique_ptr<ShmTransport>> transports_;
  std::vector<PeerInfo> infos_;
};

TEST(ShmTransport, CarriesSmallAndLargeFramesInOrder) {
  Ranks ranks(2);
  ranks.connect();
  const std::string big(3 << 20, 'x');  // larger than the ring: fragments or single copy
  ranks.send(0, 1, 1, "hello");
  ranks.send(0, 1, 2, big);
  ranks.send(0, 1, 3, "");
  for (int i = 0; i < 100000 && ranks.sink(1).frames.size() < 3; ++i) ranks.poll();
  ASSERT_EQ(ranks.sink(1).frames.size(), 3u);
  EXPECT_EQ(ranks.sink(1).frames[0].payload, "hello");
  EXPECT_EQ(ranks.sink(1).frames[1].payload, big);
  EXPECT_EQ(ranks.sink(1).frames[2].tag, 3u);
  EXPECT_TRUE(ranks.sink(1).failures.empty());
}

// Bulk frames that may complete out of order are copied by both sides (the receiver reads
// half, the sender writes half); the bytes must come out whole and the send complete only then.
TEST(ShmTransport, SplitCopiesDeliverEveryByte) {
  Ranks ranks(2);
  ranks.connect();
  std::string big(5 << 20, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + (i >> 12));
  const std::string medium = big.substr(0, 300 << 10);  // sent from its own buffer
  bool sent[3] = {false, false, false};
  ranks.send(0, 1, 1, big, Ordering::any_stream, &sent[0]);
  ranks.send(0, 1, 2, medium, Ordering::any_stream, &sent[1]);
  ranks.send(0, 1, 3, "small behind", Ordering::ordered, &sent[2]);
  for (int i = 0; i < 100000 && ranks.sink(1).frames.size() < 3; ++i) ranks.poll();
  for (int i = 0; i < 100; ++i) ranks.poll();
  ASSERT_EQ(ranks.sink(1).frames.size(), 3u);
  std::map<std::uint64_t, std::string> by_tag;
  for (const auto& f : ranks.sink(1).frames) by_tag[f.tag] = f.payload;
  EXPECT_TRUE(by_tag[1] == big) << "the 5 MiB payload arrived damaged";
  EXPECT_TRUE(by_tag[2] == medium);
  EXPECT_EQ(by_tag[3], "small behind");
  EXPECT_TRUE(sent[0] && sent[1] && sent[2]);
  EXPECT_TRUE(ranks.sink(1).failures.empty());
}

TEST(ShmTransport, CorruptRingFailsOnlyThatPeerWithAProtocolError) {
  Ranks ranks(3);
  ranks.connect();
  Mapping ring = ranks.ring(1, 0);
  ASSERT_TRUE(ring);
  auto* control = reinterpret_cast<RingControl*>(ring.data());
  // Rank 1's ring to rank 0 announces a record that is garbage.
  std::memset(ring.data() + ring_data_offset, 0xEE, 256);
  control->head.store(256);
  for (int i = 0; i < 10; ++i) ranks.poll();
  ASSERT_EQ(ranks.sink(0).failures.count(1), 1u);
  const Error& e = *ranks.sink(0).failures.at(1);
  EXPECT_EQ(e.kind(), ErrorKind::protocol);
  EXPECT_EQ(e.context().peer, 1);
  EXPECT_NE(std::string(e.what()).find("invalid data"), std::string::npos) << e.what();
  // Other traffic goes on: rank 2 still reaches rank 0, and rank 0 still reaches rank 2.
  ranks.send(2, 0, 5, "still here");
  ranks.send(0, 2, 6, "me too");
  for (int i = 0; i < 100 && (ranks.sink(0).frames.empty() || ranks.sink(2).frames.empty()); ++i)
    ranks.poll();
  ASSERT_EQ(ranks.sink(0).frames.size(), 1u);
  EXPECT_EQ(ranks.sink(0).frames[0].payload, "still here");
  ASSERT_EQ(ranks.sink(2).frames.size(), 1u);
  EXPECT_EQ(ranks.sink(0).failures.count(2), 0u);
}

// Rank 0 prepares its segment and the ring rank 1 will write to; `tamper` changes them (as a
// hostile local process with the same rights could) before rank 1 attaches. Rank 1's setup
// failure, if any.
std::optional<Error> attach_after(
    Ranks& ranks, const std::function<void(RingControl&, SegmentControl&)>& tamper) {
  ranks.connect_rank(0);
  std::string why;
  Mapping ring = ranks.map_ring(1, 0, &why);
  Mapping page = ranks.map_control(0, &why);
  EXPECT_TRUE(ring && page) << why;
  if (!ring || !page) return std::nullopt;
  auto* control = reinterpret_cast<RingControl*>(ring.data());
  EXPECT_EQ(control->ready.load(), 1u);
  tamper(*control, *reinterpret_cast<SegmentControl*>(page.data()));
  ranks.connect_rank(1);
  for (int i = 0; i < 10; ++i) ranks.poll();
  return ranks.transport(1).setup_failure();
}

TEST(ShmTransport, RingOfAnotherLayoutVersionIsALinkError) {
  Ranks ranks(2);
  // As a build with another ring layout would.
  const auto failure =
      attach_after(ranks, [](RingControl& ring, SegmentControl&) { ring.version = 9; });
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->kind(), ErrorKind::link);
  EXPECT_EQ(failure->context().peer, 0);
  EXPECT_NE(std::string(failure->what()).find("version 9"), std::string::npos) << failure->what();

  // A peer that advertises another endpoint version is not reachable, with the reason.
  std::string why;
  PeerInfo other = ranks.info(1);
  other.endpoints["shm"] = "v9 pid=1 fd=3 ring=524288 wake=x probe=10";
  EXPECT_FALSE(ranks.transport(0).can_reach(other, &why));
  EXPECT_NE(why.find("v9"), std::string::npos) << why;
}

// A ring prepared for us that does not start at 0: the writer would place its first record by
// the peer's numbers (at capacity - 8: a pad's length wraps, and its flag lands past the ring).
TEST(ShmTransport, ARingThatDoesNotStartAtZeroIsALinkError) {
  Ranks ranks(2);
  const auto failure = attach_after(ranks, [](RingControl& ring, SegmentControl&) {
    ring.head.store(ring.capacity - 8);
    ring.tail.store(ring.capacity - 8);
  });
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->kind(), ErrorKind::link);
  EXPECT_EQ(failure->context().peer, 0);
  EXPECT_NE(std::string(failure->what()).find("head"), std::string::npos) << failure->what();
}

// A segment whose header claims more slots than the job has ranks: the shared area would be
// mapped past the end of the file, and fault (SIGBUS) at its first use.
TEST(ShmTransport, ASegmentWithMoreSlotsThanRanksIsALinkError) {
  Ranks ranks(2);
  const auto failure =
      attach_after(ranks, [](RingControl&, SegmentControl& segment) { segment.slots = 1000; });
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->context().peer, 0);
  EXPECT_NE(std::string(failure->what()).find("1000 slots"), std::string::npos) << failure->what();
}

// Offers rank 1 the memory `fd` (of this process) as rank 0's segment, and lets it attach:
// rank 1's setup failure, which must be a link error with rank 0 whose text has `expected`.
void expect_segment_refused(Ranks& ranks, Endpoint e, int fd, const std::string& expected) {
  e.segment_fd = fd;
  ranks.info(0).endpoints["shm"] = encode_endpoint(e);
  ranks.connect_rank(1);
  for (int i = 0; i < 10; ++i) ranks.poll();
  const auto failure = ranks.transport(1).setup_failure();
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->kind(), ErrorKind::link);
  EXPECT_EQ(failure->context().peer, 0);
  EXPECT_NE(std::string(failure->what()).find(expected), std::string::npos) << failure->what();
}

// A peer's segment whose size is not sealed: the peer could shrink it under our mapping (our
// next touch past the new end would be SIGBUS). A link error, and nothing of it is used.
TEST(ShmTransport, APeerSegmentWhoseSizeIsNotSealedIsALinkError) {
  Ranks ranks(2);
  ranks.connect_rank(0);
  // Rank 0's segment as it is now (its ring for rank 1 set up), copied into memory whose size
  // is not sealed, and offered to rank 1 in its place.
  Endpoint e;
  std::string why;
  ASSERT_TRUE(decode_endpoint(ranks.info(0).endpoints.at("shm"), e, &why)) << why;
  base::Fd original(open_peer_segment(e.pid, e.segment_fd, &why));
  ASSERT_TRUE(original.valid()) << why;
  struct stat st {};
  ASSERT_EQ(::fstat(original.get(), &st), 0);
  std::vector<char> bytes(static_cast<std::size_t>(st.st_size));
  ASSERT_EQ(::pread(original.get(), bytes.data(), bytes.size(), 0), st.st_size);
  base::Fd copy(::memfd_create("anview-unsealed", MFD_CLOEXEC));
  ASSERT_TRUE(copy.valid());
  ASSERT_EQ(::pwrite(copy.get(), bytes.data(), bytes.size(), 0), st.st_size);
  expect_segment_refused(ranks, e, copy.get(), "not sealed");
}

// A peer segment that is sealed but smaller than its control page (here empty): reading the
// control page to check it would be SIGBUS. A link error, before anything of it is read.
TEST(ShmTransport, APeerSegmentSmallerThanItsControlPageIsALinkError) {
  Ranks ranks(2);
  ranks.connect_rank(0);
  Endpoint e;
  std::string why;
  ASSERT_TRUE(decode_endpoint(ranks.info(0).endpoints.at("shm"), e, &why)) << why;
  base::Fd small(::memfd_create("anview-small", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_TRUE(small.valid());
  ASSERT_TRUE(base::seal_size(small.get()));
  expect_segment_refused(ranks, e, small.get(), "smaller than its control page");
}

// A peer that can open a rank's segment cannot shrink it under the rank's mappings.
TEST(ShmTransport, APeerCannotShrinkARanksSegment) {
  Ranks ranks(2);
  ranks.connect();
  Endpoint e;
  std::string why;
  ASSERT_TRUE(decode_endpoint(ranks.info(0).endpoints.at("shm"), e, &why)) << why;
  base::Fd opened(open_peer_segment(e.pid, e.segment_fd, &why));
  ASSERT_TRUE(opened.valid()) << why;
  ASSERT_NE(::ftruncate(opened.get(), 0), 0) << "rank 0's segment was shrunk";
  EXPECT_EQ(errno, EPERM);
  ranks.send(1, 0, 5, "still here");
  for (int i = 0; i < 100 && ranks.sink(0).frames.empty(); ++i) ranks.poll();
  ASSERT_EQ(ranks.sink(0).frames.size(), 1u);
  EXPECT_EQ(ranks.sink(0).frames[0].payload, "still here");
}

// The rank a closing peer names as the cause comes from memory the peer writes: one that is
// not a rank of the job is not passed on as the error's peer.
TEST(ShmTransport, ACloseCauseThatIsNoRankNamesTheClosingPeer) {
  Ranks ranks(2);
  ranks.connect();
  Mapping ring = ranks.ring(1, 0);
  ASSERT_TRUE(ring);
  auto* control = reinterpret_cast<RingControl*>(ring.data());
  control->close_cause.store(1 << 20);
  control->producer_closed.store(1);
  for (int i = 0; i < 100 && ranks.sink(0).failures.count(1) == 0; ++i) ranks.poll();
  ASSERT_EQ(ranks.sink(0).failures.count(1), 1u);
  const Error& e = *ranks.sink(0).failures.at(1);
  EXPECT_EQ(e.kind(), ErrorKind::peer_lost) << e.what();
  EXPECT_EQ(e.context().peer, 1) << e.what();
}

// A rank that closes its link after a failure of its own (here: told to) wakes the peer if it
// sleeps: the peer learns at once, not at the end of its sleep.
TEST(ShmTransport, ClosingALinkWakesTheSleepingPeer) {
  Ranks ranks(2);
  ranks.connect();
  std::string why;
  Mapping page = ranks.map_control(0, &why);
  ASSERT_TRUE(page) << why;
  const auto& control = *reinterpret_cast<const SegmentControl*>(page.data());
  base::Clock::duration slept{};
  std::thread sleeper([&] {
    const auto start = base::Clock::now();
    ranks.engine(0).poll(5000);  // one round, then asleep until woken (or 5 s)
    slept = base::Clock::now() - start;
  });
  for (int i = 0; i < 5000 && control.sleeping.load() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(control.sleeping.load(), 1u) << "rank 0 never went to sleep";
  ranks.transport(1).fail_peer(
      0, Error(ErrorKind::protocol, {.rank = 1, .peer = 0, .cause = "told to close"}));
  sleeper.join();
  EXPECT_LT(slept, std::chrono::seconds(2));
  for (int i = 0; i < 10 && ranks.sink(0).failures.count(1) == 0; ++i) ranks.engine(0).poll(0);
  ASSERT_EQ(ranks.sink(0).failures.count(1), 1u);
  EXPECT_NE(std::string(ranks.sink(0).failures.at(1)->what()).find("closed its link"),
            std::string::npos)
      << ranks.sink(0).failures.at(1)->what();
}

// The peer closed its end after this rank's poller last looked and before it said it sleeps,
// so no wake-up came: the check before sleeping sees the close, and the rank does not sleep.
TEST(ShmTransport, AClosedLinkKeepsTheRankFromSleeping) {
  Ranks ranks(2);
  ranks.connect();
  Mapping ring = ranks.ring(1, 0);
  ASSERT_TRUE(ring);
  reinterpret_cast<RingControl*>(ring.data())->producer_closed.store(1);  // and no wake-up
  const auto start = base::Clock::now();
  ranks.engine(0).wait_events(5000);  // as a driver sleeps between two rounds
  EXPECT_LT(base::Clock::now() - start, std::chrono::seconds(2));
  for (int i = 0; i < 10 && ranks.sink(0).failures.count(1) == 0; ++i) ranks.engine(0).poll(0);
  ASSERT_EQ(ranks.sink(0).failures.count(1), 1u);
}

// A copy from a process that is gone is the peer's loss, logged by the link that fails with it;
// the copy logged it too, so every put or get to a killed rank wrote the same line twice. A
// copy that fails otherwise (a bad address) is logged where it fails.
TEST(CrossMemoryAccess, APeerThatIsGoneIsLoggedByItsLinkOtherFailuresHere) {
  char buffer[8] = {};
  std::uint64_t mine = 1;
  if (transport::copy_cross_memory(::getpid(), false, buffer,
                                   reinterpret_cast<std::uint64_t>(&mine), sizeof mine) != 0)
    GTEST_SKIP() << "cross-memory attach is refused here";
  // A zombie: its memory is gone, its pid not yet free for another process.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  siginfo_t exited{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(child), &exited, WEXITED | WNOWAIT), 0);
  struct Reap {
    pid_t pid;
    ~Reap() { ::waitpid(pid, nullptr, 0); }
  } reap{child};
  ::testing::internal::CaptureStderr();
  try {
    transport::CrossMemoryAccess(0, 1, child).read(0x10000, buffer, sizeof buffer, "get");
    ADD_FAILURE() << "read from a process that is gone";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::peer_lost) << e.what();
  }
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  ::testing::internal::CaptureStderr();
  try {
    transport::CrossMemoryAccess(0, 1, ::getpid()).read(8, buffer, sizeof buffer, "get");
    ADD_FAILURE() << "read from address 8";
  } catch (const Error& e) {
    EXPECT_NE(e.kind(), ErrorKind::peer_lost) << e.what();
  }
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("process_vm_readv"), std::string::npos);
}

TEST(ShmTransport, PeersOnOtherHostsAreNotReachable) {
  Ranks ranks(2);
  PeerInfo other = ranks.info(1);
  other.host_id = "elsewhere";
  std::string why;
  EXPECT_FALSE(ranks.transport(0).can_reach(other, &why));
  EXPECT_NE(why.find("another host"), std::string::npos) << why;
  EXPECT_TRUE(ranks.transport(0).can_reach(ranks.info(1), &why)) << why;
}

TEST(ShmTransport, GoodbyeClosesTheLinkQuietly) {
  Ranks ranks(2);
  ranks.connect();
  ranks.send(1, 0, 9, "last");
  ranks.transport(1).shutdown(base::Clock::now() + std::chrono::seconds(1));
  for (int i = 0; i < 10; ++i) ranks.poll();
  ASSERT_EQ(ranks.sink(0).frames.size(), 1u);
  EXPECT_EQ(ranks.sink(0).frames[0].payload, "last");
  ASSERT_EQ(ranks.sink(0).failures.count(1), 1u);
  EXPECT_NE(std::string(ranks.sink(0).failures.at(1)->what()).find("closed its communicator"),
            std::string::npos);
}

}  // namespace
}  // namespace anview::transport::shm
