#include "transport/self/self_transport.hpp"

#include <cstring>

namespace anview::transport::self {

SelfTransport::SelfTransport(const TransportContext& context) : context_(context) {
  context_.engine->add_poller([this] { return deliver(); },
                              [this] { return pending_.load(std::memory_order_acquire); });
}

Capabilities SelfTransport::capabilities() const {
  return Capabilities{.zero_copy_receive = false, .one_sided = false, .streams = 1,
                      .latency_us = 0.05, .bandwidth_gbs = 10.0};
}

bool SelfTransport::can_reach(const PeerInfo& peer, std::string* why) const {
  if (peer.rank == context_.rank) return true;
  if (why) *why = "not this process";
  return false;
}

void SelfTransport::post_send(int, const FrameHeader& header, const void* payload, Ordering,
                              SendDone done) {
  queue_.push_back(Queued{header, payload, std::move(done)});
  pending_.store(true, std::memory_order_release);
  context_.engine->wakeup();
}

void SelfTransport::resume(int) {
  paused_ = false;
  pending_.store(!queue_.empty(), std::memory_order_release);
  context_.engine->wakeup();
}

bool SelfTransport::deliver() {
  bool worked = false;
  while (!queue_.empty() && !paused_) {
    Queued q = std::move(queue_.front());
    const Landing landing = context_.sink->on_frame(context_.rank, q.header, true);
    if (landing.defer) {
      queue_.front() = std::move(q);
      paused_ = true;
      break;
    }
    queue_.pop_front();
    if (q.header.payload_bytes > 0 && landing.data != nullptr)
      std::memcpy(landing.data, q.payload, q.header.payload_bytes);
    if (q.done) q.done(nullptr);
    if (landing.data != nullptr || q.header.payload_bytes == 0)
      context_.sink->on_frame_done(context_.rank, q.header, landing.data);
    worked = true;
  }
  pending_.store(!queue_.empty() && !paused_, std::memory_order_release);
  return worked;
}

void SelfTransport::shutdown(base::Deadline) {
  const Error closed(ErrorKind::link, {.rank = context_.rank, .peer = context_.rank,
                                       .operation = "send", .cause = "communicator closed"});
  for (auto& q : queue_)
    if (q.done) q.done(&closed);
  queue_.clear();
}

}  // namespace anview::transport::self
