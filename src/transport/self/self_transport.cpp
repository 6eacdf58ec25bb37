#include "transport/self/self_transport.hpp"

#include <cstring>

namespace anview::transport::self {

SelfTransport::SelfTransport(const TransportContext& context) : context_(context) {
  context_.engine->add_poller([this] { return deliver(); },
                              [this] { return pending_.load(std::memory_order_acquire); });
}

Capabilities SelfTransport::capabilities() const {
  return Capabilities{.zero_copy_receive = false,
                      .one_sided = false,
                      .streams = 1,
                      .latency_us = 0.05,
                      .bandwidth_gbs = 10.0};
}

bool SelfTransport::can_reach(const PeerInfo& peer, std::string* why) const {
  if (peer.rank == context_.rank) return true;
  if (why) *why = "not this process";
  return false;
}

void SelfTransport::post_send(int, const FrameHeader& header, const void* payload, Ordering,
                              SendDone done) {
  if (failure_) {
    if (done) done(&*failure_);
    return;
  }
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

void SelfTransport::fail_peer(int peer, const Error& error) {
  if (failure_) return;
  failure_ = error;
  drop_queued(error);
  context_.sink->on_peer_failed(peer, error, /*left=*/false);
}

void SelfTransport::drop_queued(const Error& error) {
  std::deque<Queued> dropped;  // out of the queue first: a sender's callback may post again
  dropped.swap(queue_);
  paused_ = false;
  pending_.store(false, std::memory_order_release);
  for (auto& q : dropped)
    if (q.done) q.done(&error);
}

void SelfTransport::shutdown(base::Deadline) {
  const Error closed(ErrorKind::link, {.rank = context_.rank,
                                       .peer = context_.rank,
                                       .operation = "send",
                                       .cause = "communicator closed"});
  drop_queued(closed);
}

}  // namespace anview::transport::self
