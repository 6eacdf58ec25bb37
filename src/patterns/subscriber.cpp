#include <algorithm>
#include <deque>
#include <mutex>

#include "anview/communicator.hpp"
#include "anview/pubsub.hpp"
#include "base/log.hpp"
#include "base/timeouts.hpp"
#include "patterns/connection.hpp"
#include "patterns/pubsub_frame.hpp"

namespace anview {

namespace ps = patterns::pubsub;

namespace detail {

class SubscriberImpl {
 public:
  SubscriberImpl(const std::string& address, SubscribeOptions options);
  std::optional<Delivery> next(std::chrono::milliseconds timeout);
  // Not behind next(), which holds mu_ while it waits.
  Subscriber::Stats stats() const {
    std::lock_guard lock(stats_mu_);
    return stats_;
  }

 private:
  void post_batch_receive();
  // Takes in the batch that arrived (mu_ held).
  void take_batch(std::size_t bytes);
  void send_credit(std::uint32_t batches);
  // An entry over options_.max_message_bytes: not delivered, so the next delivery (or the end
  // of the stream) counts it as dropped. Its payload sent apart is taken into no buffer: the
  // receive refuses it (a truncation; one that goes by rendezvous fails at the publisher too).
  void skip(const ps::Entry& e);
  Error protocol_error(const std::string& why) const {
    return Error(ErrorKind::protocol, {.peer = 0,
                                       .peer_address = address_,
                                       .operation = "subscriber",
                                       .cause = "the publisher sent a bad frame: " + why});
  }

  // A message taken from a batch: one sent apart comes with the receive of its payload,
  // posted when its batch came, and is delivered once that is complete.
  struct Taken {
    Delivery delivery;
    Request payload;
  };
  // Waits for `request` until `deadline`, its Error named by the publisher's address.
  Status wait_named(Request& request, std::chrono::steady_clock::time_point deadline) const;

  std::string address_;
  SubscribeOptions options_;
  mutable std::mutex mu_;  // one next() at a time
  std::shared_ptr<std::vector<std::byte>> buffer_;
  Request batch_;
  std::deque<Taken> ready_;  // what is left of the last batch (the next comes when it is empty)
  std::size_t settled_ = 0;  // ready_[0, settled_) need no more waiting
  std::size_t ready_bytes_ = 0;
  std::uint32_t withheld_ = 0;  // batch credits not returned while ready_ is over the window
  std::uint64_t last_sequence_ = 0;
  mutable std::mutex stats_mu_;  // stats_, written under mu_ too
  Subscriber::Stats stats_;
  std::vector<ps::Entry> entries_;
  bool warned_too_large_ = false;
  // Last: destroyed first, so the receive posted into buffer_ is over before buffer_ goes.
  Communicator comm_;
};

SubscriberImpl::SubscriberImpl(const std::string& address, SubscribeOptions options)
    : address_(address),
      options_(std::move(options)),
      comm_(patterns::connect_to(address, "pubsub", options_.connect_timeout)) {
  if (options_.topics.empty() || options_.topics.size() > ps::max_topics || options_.window == 0 ||
      options_.window_bytes == 0 || options_.queue_limit == 0)
    throw Error(ErrorKind::usage,
                {.operation = "subscribe",
                 .cause = "1 to 64 topics, and a window and a queue limit above 0, are needed"});
  for (const auto& t : options_.topics) {
    if (t.size() > ps::max_topic_bytes)
      throw Error(ErrorKind::usage,
                  {.operation = "subscribe",
                   .cause = "topic of " + std::to_string(t.size()) + " bytes (limit 256)"});
  }
  post_batch_receive();
  const ps::Subscription s{.policy = options_.policy,
                           .window = options_.window,
                           .window_bytes = options_.window_bytes,
                           .queue_limit = options_.queue_limit,
                           .topics = options_.topics};
  auto frame = ps::encode_subscribe(s);
  comm_.send(frame.data(), frame.size(), 0, ps::control_tag);
}

void SubscriberImpl::post_batch_receive() {
  // A new buffer each time: the messages of the last one refer to it.
  buffer_ = std::make_shared<std::vector<std::byte>>(ps::batch_capacity);
  batch_ = comm_.irecv(buffer_->data(), buffer_->size(), 0, ps::batch_tag);
}

void SubscriberImpl::skip(const ps::Entry& e) {
  if (e.apart) comm_.irecv(nullptr, 0, 0, ps::payload_tag);  // in batch order, like the others
  base::log("pubsub", warned_too_large_ ? base::LogLevel::debug : base::LogLevel::warn,
            "subscriber of ", address_, ": message ", e.sequence, " on topic '", e.topic, "' has ",
            e.payload_bytes, " bytes, over max_message_bytes (", options_.max_message_bytes,
            "): skipped, counted as dropped",
            warned_too_large_ ? "" : " (more are logged at debug)");
  warned_too_large_ = true;
}

void SubscriberImpl::send_credit(std::uint32_t batches) {
  patterns::send_owned(comm_, 0, ps::control_tag, ps::encode_credit(batches, 0));
}

void SubscriberImpl::take_batch(std::size_t bytes) {
  const std::span<const std::byte> frame(buffer_->data(), bytes);
  ps::Header h;
  std::string why;
  if (!ps::parse_header(frame, h, why)) throw protocol_error(why);
  if (h.kind == ps::Kind::end) {
    if (h.value < last_sequence_) throw protocol_error("the end precedes a delivered sequence");
    std::lock_guard stats_lock(stats_mu_);
    stats_.dropped += h.value - last_sequence_;
    last_sequence_ = h.value;
    stats_.ended = true;
    return;
  }
  if (!ps::parse_batch(frame, options_.max_message_bytes, entries_, why)) throw protocol_error(why);
  auto owner = buffer_;
  for (const auto& e : entries_) {
    if (e.sequence <= last_sequence_)
      throw protocol_error("sequence " + std::to_string(e.sequence) + " after " +
                           std::to_string(last_sequence_));
    if (e.too_large) {
      skip(e);
      continue;
    }
    Delivery d;
    d.topic = std::string(e.topic);
    d.sequence = e.sequence;
    d.dropped_before = e.sequence - last_sequence_ - 1;
    last_sequence_ = e.sequence;
    Request payload_receive;
    if (e.apart) {
      // Posted now, in batch order (the payloads come in that order on their tag); next()
      // waits for it within its own timeout.
      auto payload = std::make_shared<std::vector<std::byte>>(e.payload_bytes);
      payload_receive = comm_.irecv(payload->data(), payload->size(), 0, ps::payload_tag);
      d.message = Message::view(payload->data(), payload->size());
      d.message.keep_alive(std::move(payload));
    } else {
      d.message = Message::view(e.inline_payload.data(), e.inline_payload.size());
      d.message.keep_alive(owner);
    }
    ready_bytes_ += e.payload_bytes;
    ready_.push_back({std::move(d), std::move(payload_receive)});
  }
  // Credit for the next batch now, unless this subscriber holds a window's worth already.
  if (ready_.size() < options_.window && ready_bytes_ < options_.window_bytes) {
    send_credit(1);
  } else {
    ++withheld_;
  }
  post_batch_receive();
}

Status SubscriberImpl::wait_named(Request& request,
                                  std::chrono::steady_clock::time_point deadline) const {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  try {
    return request.wait(std::max(left, std::chrono::milliseconds(0)));
  } catch (const Error& e) {
    // Named by the publisher's address (the connection's ranks mean nothing to the caller).
    throw Error(e.kind(), {.peer = 0,
                           .peer_address = address_,
                           .operation = "subscriber of " + address_,
                           .cause = e.cause()});
  }
}

std::optional<Delivery> SubscriberImpl::next(std::chrono::milliseconds timeout) {
  std::lock_guard lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (ready_.empty()) {
    if (stats_.ended) return std::nullopt;  // written under mu_ (take_batch), held here
    take_batch(wait_named(batch_, deadline).bytes);
  }
  // A payload still on its way keeps its message first in line: a timeout here leaves it
  // there for the next call. One that came short is not delivered padded.
  Taken& front = ready_.front();
  if (front.payload.valid() &&
      wait_named(front.payload, deadline).bytes != front.delivery.message.size())
    throw protocol_error("the payload of message " + std::to_string(front.delivery.sequence) +
                         " came short");
  // The batch's other payloads move only while this side progresses, and the publisher's
  // flush() waits for them: take them in too, within the deadline, each looked at once. Their
  // failures are reported when their messages come first.
  for (settled_ = std::max<std::size_t>(settled_, 1); settled_ < ready_.size(); ++settled_) {
    Request& payload = ready_[settled_].payload;
    if (!payload.valid() || payload.done()) continue;
    try {
      wait_named(payload, deadline);
    } catch (const Error&) {
      break;
    }
  }
  Delivery d = std::move(front.delivery);
  ready_.pop_front();
  if (settled_ > 0) --settled_;
  ready_bytes_ -= d.message.size();
  {
    std::lock_guard stats_lock(stats_mu_);
    ++stats_.delivered;
    stats_.dropped += d.dropped_before;
  }
  if (withheld_ > 0 && ready_.size() <= options_.window / 2 &&
      ready_bytes_ <= options_.window_bytes / 2) {
    send_credit(withheld_);
    withheld_ = 0;
  }
  return d;
}

}  // namespace detail

Subscriber::Subscriber(std::shared_ptr<detail::SubscriberImpl> impl) : impl_(std::move(impl)) {}
Subscriber Subscriber::connect(const std::string& address, SubscribeOptions options) {
  return Subscriber(std::make_shared<detail::SubscriberImpl>(address, std::move(options)));
}
std::optional<Delivery> Subscriber::next(std::optional<std::chrono::milliseconds> timeout) {
  return impl_->next(base::timeout_or_default(timeout));
}
Subscriber::Stats Subscriber::stats() const {
  return impl_->stats();
}

}  // namespace anview
