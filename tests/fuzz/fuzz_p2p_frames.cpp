// The receiving side of the p2p protocol (p2p/messenger_frames.cpp): every transport hands it
// the frames a peer sent, and a peer may be hostile or broken. Rank 0 of a two-rank world
// (in-process transport) gets the input's frames as if rank 1 had sent them, between receives
// and sends of its own, exactly as a transport delivers them (transport.hpp: on_frame, the
// payload copied into the landing, on_frame_done). ASan sees any landing too small for its
// payload; the checks below hold for every request that completes.
// Input: a sequence of operations, each an opcode byte and its arguments:
//   0 irecv   source (bit 0: any), tag byte, capacity u16
//   1 frame   type, flags, tag byte, id (byte < 0x80: that request of ours, else u64), arg u64,
//             payload u16 (capped by what the input has left; the rest zeros), may_defer byte
//   2 isend   tag byte, bytes u16 << (byte & 7) (rendezvous above 64 KiB)
//   3 progress
//   4 region  bytes u16: rank 0 registers a region (frames of type put/get and the key frames
//             with a tag byte < 0x80 name one of them, else the tag is a u64)
//   5 rma     bit 0: get, else put; bytes u16; offset u16: to a made-up region of rank 1
//             (emulated: the input's frames answer it)
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "check.hpp"
#include "p2p/messenger.hpp"
#include "p2p/request_impl.hpp"

namespace p2p = anview::p2p;
using anview::Tag;
using anview::transport::FrameHeader;

namespace {

// Reads the input front to back; past its end every value is zero.
class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool done() const { return at_ >= size_; }
  std::uint8_t u8() { return at_ < size_ ? data_[at_++] : 0; }
  std::uint64_t uint(int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= std::uint64_t{u8()} << (8 * i);
    return v;
  }
  std::size_t take(std::size_t wanted, const std::uint8_t** from) {
    const std::size_t n = std::min(wanted, size_ - std::min(at_, size_));
    *from = data_ + at_;
    at_ += n;
    return n;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t at_ = 0;
};

struct World {
  std::shared_ptr<p2p::Messenger> rank[2];

  World() {
    std::vector<anview::transport::PeerInfo> peers;
    for (int r = 0; r < 2; ++r) {
      rank[r] = std::make_shared<p2p::Messenger>(p2p::MessengerConfig{
          .rank = r,
          .world_size = 2,
          .job_id = 7,
          .host_id = "fuzz",
          .timeout = timeout,
          .background_progress = false});  // the fuzzer delivers frames itself, unlocked
      peers.push_back(rank[r]->self_info());
    }
    both([&](p2p::Messenger& m) { m.connect(peers); });
  }
  ~World() {
    both([](p2p::Messenger& m) { m.shutdown(); });
  }

  // Runs fn on both ranks at once (connect and shutdown wait for each other).
  template <typename Fn>
  void both(Fn fn) {
    std::thread other([&] { fn(*rank[1]); });
    fn(*rank[0]);
    other.join();
  }

  static constexpr std::chrono::milliseconds timeout{2000};
};

struct Posted {
  p2p::RequestPtr request;
  std::vector<char> buffer;  // exactly its capacity: ASan sees a write past it
};

// What a completed request of rank 0 must look like.
void check_completed(const Posted& p) {
  const auto& r = *p.request;
  if (!r.done.load() || r.error) return;
  if (r.kind == anview::detail::RequestImpl::Kind::recv) {
    FUZZ_CHECK(r.status.bytes <= r.capacity);
    FUZZ_CHECK(r.status.source == 1 || r.status.source == 0);
  } else if (r.kind == anview::detail::RequestImpl::Kind::get ||
             r.kind == anview::detail::RequestImpl::Kind::put) {
    FUZZ_CHECK(r.received == r.expected);
    FUZZ_CHECK(r.status.bytes == r.expected);
  } else {
    FUZZ_CHECK(r.status.bytes == r.send_bytes);
  }
}

struct Region {
  std::vector<char> memory;
  anview::RemoteKey key;
};

void deliver(p2p::Messenger& m, Input& in, const std::vector<Posted>& ours,
             const std::vector<Region>& regions) {
  FrameHeader h;
  h.type = in.u8() % 14;  // the twelve p2p types, and two that are none
  h.flags = in.u8();
  const std::uint8_t tag = in.u8();
  // put, get and the key frames (key_request, key_withdraw, key_withdrawn): the tag is a
  // region's token
  const bool rma = h.type == 5 || h.type == 7 || h.type == 9 || h.type == 11 || h.type == 12;
  h.tag = !rma                             ? tag % 4u
          : tag < 0x80 && !regions.empty() ? regions[tag % regions.size()].key.token
                                           : in.uint(8);
  const std::uint8_t pick = in.u8();
  h.id = pick < 0x80 && !ours.empty() ? ours[pick % ours.size()].request->id : in.uint(8);
  h.arg = in.uint(8);
  const std::size_t wanted = in.uint(2);
  const bool may_defer = (in.u8() & 1) != 0;
  const std::uint8_t* payload = nullptr;
  const std::size_t have = in.take(wanted, &payload);
  h.payload_bytes = static_cast<std::uint32_t>(wanted);
  const auto landing = m.on_frame(1, h, may_defer);
  if (landing.defer) {
    FUZZ_CHECK(may_defer);
    return;  // a transport offers it again later; this one drops it
  }
  if (landing.data != nullptr && wanted > 0) {
    // The landing must hold the whole payload (ASan checks the receive buffers).
    std::memcpy(landing.data, payload, have);
    std::memset(static_cast<char*>(landing.data) + have, 0, wanted - have);
  }
  if (landing.data != nullptr || wanted == 0) m.on_frame_done(1, h, landing.data);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ::setenv("ANVIEW_TRANSPORTS", "inproc", 1);
  ::setenv("ANVIEW_LOG_LEVEL", "error", 0);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const int initialized = LLVMFuzzerInitialize(nullptr, nullptr);
  (void)initialized;
  Input in(data, size);
  World world;
  p2p::Messenger& m = *world.rank[0];
  std::vector<Posted> ours;
  std::vector<Region> regions;
  static const std::vector<char> source(1 << 22, 'x');
  for (int ops = 0; !in.done() && ops < 64; ++ops) {
    switch (in.u8() % 6) {
      case 0: {
        const int from = (in.u8() & 1) ? anview::any_source : 1;
        const Tag tag{in.u8() % 4u};
        Posted p;
        p.buffer.resize(in.uint(2));
        p.request = m.irecv(p.buffer.data(), p.buffer.size(), from, tag);
        ours.push_back(std::move(p));
        break;
      }
      case 1:
        deliver(m, in, ours, regions);
        break;
      case 4: {
        Region r;
        r.memory.resize(in.uint(2));  // exactly its size: ASan sees a write past it
        r.key = m.register_memory(r.memory.data(), r.memory.size());
        regions.push_back(std::move(r));
        break;
      }
      case 5: {
        const bool get = (in.u8() & 1) != 0;
        Posted p;
        p.buffer.resize(in.uint(2));
        const std::uint64_t offset = in.uint(2);
        const anview::RemoteKey key{.rank = 1, .token = 77, .bytes = 1u << 17};
        p.request = get ? m.get(p.buffer.data(), p.buffer.size(), key, offset)
                        : m.put(source.data(), p.buffer.size(), key, offset);
        ours.push_back(std::move(p));
        break;
      }
      case 2: {
        const Tag tag{in.u8() % 4u};
        const std::size_t bytes = std::min<std::size_t>(in.uint(2) << (in.u8() & 7), source.size());
        Posted p;
        p.request = m.isend(source.data(), bytes, 1, tag);
        ours.push_back(std::move(p));
        break;
      }
      default:
        m.progress();
        break;
    }
  }
  m.progress();
  for (const auto& p : ours) check_completed(p);
  return 0;
}
