// anview::Publisher / Subscriber — topics over Anview's transports, without silent loss.
//
// A publisher listens on an address; subscribers connect to it (each connection a private
// two-rank communicator, so shared memory on one host and TCP across hosts, as for RPC) and
// name the topics they want (prefix match, as in ZeroMQ: "" is every topic). A subscriber
// starts at the next message published after it subscribed.
//
// Flow control is per subscriber: it grants the publisher credit (SubscribeOptions::window
// messages and window_bytes bytes not yet taken by next()); beyond that, messages wait in a
// queue at the publisher (queue_limit messages). When that queue is full, the subscription's
// policy decides:
//   Backpressure::block        publish() waits for the subscriber (up to the publisher's
//                              block_timeout, then an Error naming it) — nothing is lost:
//                              that subscriber does not get the message the Error is for
//                              (its sequence numbers go on without a gap), every other
//                              subscriber of the topic does;
//   Backpressure::drop_oldest  the oldest queued message is dropped and counted.
// Every message a subscriber is owed is either delivered or counted as dropped: deliveries carry
// the subscription's sequence number and how many were dropped just before it, and the end of
// the stream (Publisher::close) says how many were dropped after the last one. The framing is in
// docs/pubsub.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "anview/message.hpp"

namespace anview {

namespace detail {
class PublisherImpl;
class SubscriberImpl;
}  // namespace detail

enum class Backpressure : std::uint8_t { block = 0, drop_oldest = 1 };

struct PublisherOptions {
  // How long publish() may wait for a blocking subscriber. Zero: ANVIEW_TIMEOUT.
  std::chrono::milliseconds block_timeout{0};
  // How long a connecting subscriber may take. Zero: ANVIEW_TIMEOUT.
  std::chrono::milliseconds connect_timeout{0};
};

class Publisher {
 public:
  static Publisher listen(const std::string& host_port, PublisherOptions options = {});

  // Publishes `message` (bytes; tensors are for RPC) to every subscriber of `topic`. Small
  // messages are copied; larger ones (over 4 KiB) are sent from the message's memory, which
  // must stay valid until flush() returns (or use a Message that owns its bytes).
  void publish(std::string_view topic, const Message& message);
  // Waits until every message published so far has been handed to its subscribers' transport
  // or dropped by policy, and the larger ones sent from the message's memory have been taken
  // by their subscribers (so that memory may be reused once it returns).
  void flush(std::optional<std::chrono::milliseconds> timeout = {});
  // Ends every subscription: subscribers get what was sent, then the end of the stream.
  void close();

  std::string address() const;
  std::size_t subscribers() const;
  struct Stats {
    std::uint64_t published = 0;  // publish() calls
    std::uint64_t sent = 0;       // messages handed to subscribers (all of them)
    // Messages dropped by drop_oldest, and those close() found still queued when its flush
    // ran out of time (all subscribers).
    std::uint64_t dropped = 0;
    // Messages a blocking subscriber did not get because publish() timed out on it (that
    // publish raised, naming it; the others of the topic got the message).
    std::uint64_t timed_out = 0;
  };
  Stats stats() const;

 private:
  explicit Publisher(std::shared_ptr<detail::PublisherImpl> impl);
  std::shared_ptr<detail::PublisherImpl> impl_;
};

struct SubscribeOptions {
  std::vector<std::string> topics{""};  // prefixes; "" matches every topic
  Backpressure policy = Backpressure::block;
  std::uint32_t window = 4096;                           // messages granted ahead of next()
  std::uint64_t window_bytes = std::uint64_t{64} << 20;  // bytes granted ahead of next()
  std::uint32_t queue_limit = 4096;  // messages queued at the publisher beyond the window (> 0)
  std::chrono::milliseconds connect_timeout{0};  // zero: ANVIEW_TIMEOUT
  // A message larger than this is skipped (a warning is logged) and counted as dropped; the
  // subscription goes on.
  std::size_t max_message_bytes = std::size_t{1} << 30;
};

struct Delivery {
  std::string topic;
  std::uint64_t sequence = 0;        // 1, 2, ... over this subscription
  std::uint64_t dropped_before = 0;  // messages dropped between the previous delivery and this
  Message message;
};

class Subscriber {
 public:
  static Subscriber connect(const std::string& address, SubscribeOptions options = {});

  // The next message, waiting up to `timeout` in all (none: ANVIEW_TIMEOUT; zero: only what is
  // here already), also for the payload of a large message; nullopt when the publisher closed
  // the stream and everything was delivered. Raises Error(timeout) when nothing came in time
  // (a message whose payload is still on its way stays first in line), Error(protocol) for a
  // bad frame or a payload shorter than announced, and the connection's Error when the
  // publisher is gone.
  std::optional<Delivery> next(std::optional<std::chrono::milliseconds> timeout = {});

  struct Stats {
    std::uint64_t delivered = 0;
    std::uint64_t dropped = 0;  // gaps, and the drops the end of the stream reported
    bool ended = false;
  };
  Stats stats() const;

 private:
  explicit Subscriber(std::shared_ptr<detail::SubscriberImpl> impl);
  std::shared_ptr<detail::SubscriberImpl> impl_;
};

}  // namespace anview
