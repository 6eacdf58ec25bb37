// The receiving side of the p2p protocol (p2p/messenger_frames.cpp) against frames a broken or
// hostile peer sends: rank 0 of a two-rank world (in-process transport) gets frames as if rank 1
// had sent them, delivered as a transport delivers them (on_frame, the payload copied into the
// landing, on_frame_done), as tests/fuzz/fuzz_p2p_frames.cpp does.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "p2p/messenger.hpp"
#include "p2p/protocol.hpp"
#include "p2p/request_impl.hpp"
#include "support/scoped_env.hpp"

namespace anview::p2p {
namespace {

using transport::FrameHeader;

class HostileFrames : public ::testing::Test {
 protected:
  HostileFrames() {
    std::vector<transport::PeerInfo> peers;
    for (int r = 0; r < 2; ++r) {
      rank_[r] = std::make_shared<Messenger>(MessengerConfig{.rank = r,
                                                             .world_size = 2,
                                                             .job_id = 7,
                                                             .host_id = "test",
                                                             .timeout = std::chrono::seconds(2),
                                                             .background_progress = false});
      peers.push_back(rank_[r]->self_info());
    }
    both([&](Messenger& m) { m.connect(peers); });
  }
  ~HostileFrames() override {
    both([](Messenger& m) { m.shutdown(); });
  }

  // Runs fn on both ranks at once (connect and shutdown wait for each other).
  template <typename Fn>
  void both(Fn fn) {
    std::thread other([&] { fn(*rank_[1]); });
    fn(*rank_[0]);
    other.join();
  }

  // Delivers a frame "from rank 1" to rank 0 with `payload` bytes of `fill`; false when rank 0
  // refused it (no landing).
  bool deliver(FrameType type, std::uint64_t tag, std::uint64_t id, std::uint64_t arg,
               std::size_t payload, char fill = 'p') {
    FrameHeader h;
    h.type = static_cast<std::uint8_t>(type);
    h.tag = tag;
    h.id = id;
    h.arg = arg;
    h.payload_bytes = static_cast<std::uint32_t>(payload);
    const auto landing = rank_[0]->on_frame(1, h, false);
    if (landing.data == nullptr && payload > 0) return false;
    if (payload > 0) std::memset(landing.data, fill, payload);
    rank_[0]->on_frame_done(1, h, landing.data);
    return true;
  }

  // The world's two ranks; the scoped variable outlives them.
  testing::ScopedEnv inproc_{"ANVIEW_TRANSPORTS", "inproc"};
  std::shared_ptr<Messenger> rank_[2];
};

// A rendezvous message's data chunks partition it: a chunk that comes twice (two halves at
// offset 0 for a two-half message) is a protocol error that fails the receive. It used to
// complete the receive "successfully" with its second half never written.
TEST_F(HostileFrames, ARendezvousChunkThatComesTwiceIsAProtocolError) {
  constexpr std::size_t bytes = 100000;
  std::vector<char> buffer(bytes, 'u');
  RequestPtr recv = rank_[0]->irecv(buffer.data(), buffer.size(), 1, Tag{5});
  ASSERT_TRUE(deliver(FrameType::rts, 5, /*sender's id=*/42, bytes, 0));
  ASSERT_TRUE(deliver(FrameType::data, 0, recv->id, 0, bytes / 2));
  EXPECT_FALSE(deliver(FrameType::data, 0, recv->id, 0, bytes / 2));
  try {
    rank_[0]->wait(*recv, std::chrono::seconds(2));
    ADD_FAILURE() << "the receive completed; byte " << bytes - 1 << " is '" << buffer[bytes - 1]
                  << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::protocol) << e.what();
    EXPECT_NE(std::string(e.what()).find("a chunk came twice"), std::string::npos) << e.what();
  }
}

// An announcement of an empty large message is no sender's (an empty message goes eagerly): a
// protocol error that fails the link at once. The receive it matched used to wait for data
// that never comes, until its timeout.
TEST_F(HostileFrames, AnAnnouncedEmptyMessageIsAProtocolError) {
  std::vector<char> buffer(64);
  RequestPtr recv = rank_[0]->irecv(buffer.data(), buffer.size(), 1, Tag{5});
  ASSERT_TRUE(deliver(FrameType::rts, 5, /*sender's id=*/42, /*bytes=*/0, 0));
  try {
    rank_[0]->wait(*recv, std::chrono::seconds(2));
    ADD_FAILURE() << "a receive of an announced empty message completed";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::protocol) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad ready-to-send frame (size 0"), std::string::npos)
        << e.what();
  }
}

// Chunks in any order (streams and paths deliver them so) complete the receive once they cover
// the message, each written where its offset says.
TEST_F(HostileFrames, RendezvousChunksInAnyOrderCompleteTheReceive) {
  constexpr std::size_t third = 40000;
  std::vector<char> buffer(3 * third, 'u');
  RequestPtr recv = rank_[0]->irecv(buffer.data(), buffer.size(), 1, Tag{6});
  ASSERT_TRUE(deliver(FrameType::rts, 6, /*sender's id=*/43, buffer.size(), 0));
  ASSERT_TRUE(deliver(FrameType::data, 0, recv->id, third, third, 'b'));
  ASSERT_TRUE(deliver(FrameType::data, 0, recv->id, 2 * third, third, 'c'));
  EXPECT_FALSE(recv->done.load());
  ASSERT_TRUE(deliver(FrameType::data, 0, recv->id, 0, third, 'a'));
  EXPECT_EQ(rank_[0]->wait(*recv, std::chrono::seconds(2)).bytes, buffer.size());
  EXPECT_EQ(buffer[0], 'a');
  EXPECT_EQ(buffer[third], 'b');
  EXPECT_EQ(buffer[3 * third - 1], 'c');
}

}  // namespace
}  // namespace anview::p2p
