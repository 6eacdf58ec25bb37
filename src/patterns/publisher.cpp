#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "anview/pubsub.hpp"
#include "base/log.hpp"
#include "base/timeouts.hpp"
#include "patterns/connection.hpp"
#include "patterns/pubsub_frame.hpp"

namespace anview {

namespace ps = patterns::pubsub;

namespace detail {
namespace {

// Batches a subscriber may hold unacknowledged: the first messages go at once; while they
// travel, later ones gather into the next batch (acknowledgement-clocked batching).
constexpr std::uint32_t batches_in_flight = 4;

// Messages waiting for a subscriber's credit, as one frame being built and the payloads sent
// apart after it. Drop-oldest removes entries from the front (BatchWriter::drop_front).
struct PendingBatch {
  ps::BatchWriter writer;
  std::vector<Message> apart;  // per entry in add() order: its payload sent apart, or empty
  bool has_apart = false;
  std::size_t apart_bytes = 0;
  std::size_t live() const { return writer.entries(); }
};

}  // namespace

struct SubscriberLink {
  SubscriberLink(Communicator c, std::uint64_t number, ps::Subscription s)
      : comm(std::move(c)), id(number), subscription(std::move(s)) {}
  Communicator comm;
  std::uint64_t id;
  ps::Subscription subscription;

  std::mutex mu;  // everything below
  std::condition_variable cv;
  std::uint32_t credit = batches_in_flight;
  std::uint64_t sequence = 0;  // the last one given
  std::deque<PendingBatch> pending;
  std::size_t queued = 0;  // live entries in pending
  std::uint64_t sent = 0, dropped = 0;
  bool gone = false;
  // Sends not complete yet: a payload sent apart travels by rendezvous, so the connection must
  // stay open until the subscriber has taken it.
  std::shared_ptr<std::atomic<int>> in_flight = std::make_shared<std::atomic<int>>(0);

  bool wants(std::string_view topic) const {
    for (const auto& prefix : subscription.topics)
      if (topic.starts_with(prefix)) return true;
    return false;
  }
  std::string name() const { return "subscriber connection " + std::to_string(id); }

  // Sends what credit allows (mu held).
  void send_ready();
  // Queues one message (mu held), applying the policy when the queue is full.
  void enqueue(std::string_view topic, const Message& message);
};

void SubscriberLink::send_ready() {
  while (credit > 0 && !pending.empty() && pending.front().live() > 0) {
    PendingBatch batch = std::move(pending.front());
    pending.pop_front();
    queued -= batch.live();
    const auto frame = batch.writer.frame();
    try {
      in_flight->fetch_add(1);
      patterns::send_owned(comm, 1, ps::batch_tag, {frame.begin(), frame.end()},
                           [count = in_flight] { --*count; });
      for (std::size_t e = batch.writer.dropped(); e < batch.apart.size(); ++e) {
        if (batch.apart[e].size() == 0) continue;
        auto held = std::make_shared<Message>(std::move(batch.apart[e]));
        in_flight->fetch_add(1);
        comm.isend(held->bytes().data(), held->size(), 1, ps::payload_tag)
            .on_complete([held, count = in_flight](const Status&, const Error*) { --*count; });
      }
    } catch (const Error& e) {
      gone = true;  // the connection's thread reports it
      return;
    }
    sent += batch.live();
    --credit;
  }
}

void SubscriberLink::enqueue(std::string_view topic, const Message& message) {
  const bool apart = message.size() > ps::inline_limit;
  const std::size_t need = ps::BatchWriter::entry_size(topic, apart ? 0 : message.size());
  if (pending.empty() || pending.back().writer.size() + need > ps::batch_capacity ||
      (apart && pending.back().has_apart &&
       pending.back().apart_bytes + message.size() > ps::apart_bytes_per_batch))
    pending.emplace_back();
  PendingBatch& batch = pending.back();
  batch.writer.add(++sequence, topic, message.bytes(), apart);
  batch.apart.push_back(apart ? message : Message());
  if (apart) {
    batch.has_apart = true;
    batch.apart_bytes += message.size();
  }
  ++queued;
  if (subscription.policy == Backpressure::drop_oldest) {
    while (queued > subscription.queue_limit) {
      PendingBatch& front = pending.front();
      front.apart[front.writer.dropped()] = Message();
      front.writer.drop_front();
      --queued;
      ++dropped;
      if (front.live() == 0) pending.pop_front();
    }
  }
}

class PublisherImpl {
 public:
  PublisherImpl(const std::string& host_port, PublisherOptions options)
      : block_timeout_(base::timeout_or_default(options.block_timeout)) {
    listener_ = std::make_unique<patterns::Listener>(
        host_port, "pubsub", options.connect_timeout,
        [this](Communicator comm, std::uint64_t id) { serve(std::move(comm), id); });
  }
  ~PublisherImpl() { close(); }

  void publish(std::string_view topic, const Message& message);
  void flush(std::chrono::milliseconds timeout);
  void close();
  std::string address() const { return listener_->address(); }
  std::size_t subscribers() const {
    std::shared_lock lock(links_mu_);
    return links_.size();
  }
  Publisher::Stats stats() const;

 private:
  void serve(Communicator comm, std::uint64_t id);
  // The end of the stream for a subscriber that came while the publisher closed, after the
  // streams it knew of were ended (or before its subscription was read): sent at once, and
  // awaited up to the block timeout, so that its next() ends with no message, not a broken
  // connection.
  void end_stream_alone(Communicator& comm);
  bool wait_or_stop(Request& r) {
    return patterns::wait_unless_stopping(r, listener_->stop_flag());
  }

  std::chrono::milliseconds block_timeout_;
  mutable std::shared_mutex links_mu_;
  std::vector<std::shared_ptr<SubscriberLink>> links_;
  std::atomic<std::uint64_t> published_{0};
  std::uint64_t sent_gone_ = 0, dropped_gone_ = 0;  // of links that left (links_mu_)
  std::atomic<std::uint64_t> timed_out_{0};         // Publisher::Stats::timed_out
  std::atomic<bool> closed_{false};
  bool streams_ended_ = false;  // close() sent every listed link its end (links_mu_)
  std::unique_ptr<patterns::Listener> listener_;
};

void PublisherImpl::serve(Communicator comm, std::uint64_t id) {
  // Room for the longest subscription (credit frames, received into it later, are shorter).
  std::vector<std::byte> buffer(ps::max_subscribe_bytes);
  Request r = comm.irecv(buffer.data(), buffer.size(), 1, ps::control_tag);
  if (!wait_or_stop(r)) {
    patterns::cancel_or_finish(r);  // `buffer` goes away when this returns
    if (closed_.load()) end_stream_alone(comm);
    return;
  }
  ps::Subscription subscription;
  std::string why;
  if (!ps::parse_subscribe({buffer.data(), r.status().bytes}, subscription, why)) {
    base::log("pubsub", base::LogLevel::error, "publisher at ", address(),
              ": subscriber connection ", id, " sent a bad subscribe frame (", why,
              "); connection closed");
    return;
  }
  auto link = std::make_shared<SubscriberLink>(comm, id, std::move(subscription));
  bool listed = false;
  {
    std::unique_lock lock(links_mu_);
    listed = !streams_ended_;
    if (listed) links_.push_back(link);
  }
  if (!listed) {  // close() ended the streams it knew of before this one came
    end_stream_alone(comm);
    return;
  }
  try {
    for (;;) {
      r = comm.irecv(buffer.data(), buffer.size(), 1, ps::control_tag);
      if (!wait_or_stop(r)) {
        patterns::cancel_or_finish(r);
        break;
      }
      ps::Header h;
      if (!ps::parse_header({buffer.data(), r.status().bytes}, h, why) ||
          h.kind != ps::Kind::credit) {
        if (why.empty()) why = "a frame that is not a credit";
        base::log("pubsub", base::LogLevel::error, "publisher at ", address(), ": ", link->name(),
                  " sent a bad frame (", why, "); connection closed");
        break;
      }
      std::lock_guard lock(link->mu);
      link->credit = std::min<std::uint32_t>(link->credit + h.count, batches_in_flight);
      link->send_ready();
      link->cv.notify_all();
    }
  } catch (const Error& e) {
    base::log("pubsub", base::LogLevel::info, "publisher at ", address(), ": ", link->name(),
              " left: ", e.what());
  }
  {
    std::lock_guard lock(link->mu);
    link->gone = true;
    link->cv.notify_all();
  }
  std::unique_lock lock(links_mu_);
  std::erase(links_, link);
  std::lock_guard link_lock(link->mu);
  sent_gone_ += link->sent;
  dropped_gone_ += link->dropped;
}

void PublisherImpl::end_stream_alone(Communicator& comm) {
  const std::vector<std::byte> end = ps::encode_end(0);
  try {
    Request r = comm.isend(end.data(), end.size(), 1, ps::batch_tag);
    try {
      r.wait(block_timeout_);
    } catch (const Error& e) {
      if (!r.done()) r.abandon(e);  // its buffer goes away when this returns
      throw;
    }
  } catch (const Error& e) {
    base::log(
        "pubsub", base::LogLevel::info, "publisher at ", address(),
        ": a subscriber that came while it closed did not get the end of its stream: ", e.what());
  }
}

void PublisherImpl::publish(std::string_view topic, const Message& message) {
  if (!message.tensors().empty())
    throw Error(ErrorKind::usage,
                {.operation = "publish", .cause = "pub/sub carries bytes; send tensors by RPC"});
  if (topic.size() > ps::max_topic_bytes ||
      message.size() > std::numeric_limits<std::uint32_t>::max())
    throw Error(ErrorKind::usage,
                {.operation = "publish",
                 .cause = "a topic of " + std::to_string(topic.size()) + " bytes (limit " +
                          std::to_string(ps::max_topic_bytes) + ") or a message of " +
                          std::to_string(message.size()) + " bytes (limit 4 GiB - 1)"});
  // Checked again under the lock close() takes once it has set closed_: a publish that passes
  // the check queues its message before close() flushes and ends the streams. (The first check
  // keeps publishes that come after close() from holding the lock it waits for.)
  auto check_open = [&] {
    if (closed_.load(std::memory_order_acquire))
      throw Error(ErrorKind::usage, {.operation = "publish", .cause = "the publisher is closed"});
  };
  check_open();
  std::shared_lock lock(links_mu_);
  check_open();
  // One wait for every blocking subscriber together, not block_timeout_ each.
  const auto deadline = std::chrono::steady_clock::now() + block_timeout_;
  published_.fetch_add(1, std::memory_order_relaxed);
  // A blocking subscriber that takes nothing in time misses this message (the publish raises,
  // naming it); the others of the topic still get it, so one stalled subscriber does not cut
  // the rest off.
  std::string stuck;
  std::size_t stuck_count = 0, served = 0;
  for (const auto& link : links_) {
    if (!link->wants(topic)) continue;
    std::unique_lock l(link->mu);
    if (link->gone) continue;
    if (link->subscription.policy == Backpressure::block &&
        link->queued >= link->subscription.queue_limit) {
      while (!link->gone && link->queued >= link->subscription.queue_limit &&
             link->cv.wait_until(l, deadline) != std::cv_status::timeout) {
      }
      if (link->gone) continue;
      if (link->queued >= link->subscription.queue_limit) {
        stuck += (stuck_count++ > 0 ? ", " : "") + link->name() + " (its queue holds " +
                 std::to_string(link->queued) + " messages)";
        continue;
      }
    }
    link->enqueue(topic, message);
    link->send_ready();
    ++served;
  }
  if (stuck_count > 0) {
    timed_out_.fetch_add(stuck_count, std::memory_order_relaxed);
    throw Error(ErrorKind::timeout,
                {.peer = 1,
                 .operation = "publish '" + std::string(topic) + "'",
                 .cause = stuck + " still had a full queue when the publish's " +
                          std::to_string(block_timeout_.count()) +
                          " ms ran out (policy block), so it did not get this message; the " +
                          std::to_string(served) + " other subscriber" + (served == 1 ? "" : "s") +
                          " of the topic did"});
  }
}

void PublisherImpl::flush(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::shared_ptr<SubscriberLink>> links;
  {
    std::shared_lock lock(links_mu_);
    links = links_;
  }
  for (const auto& link : links) {
    std::unique_lock l(link->mu);
    while (!link->gone && link->queued > 0) {
      if (link->cv.wait_until(l, deadline) == std::cv_status::timeout && link->queued > 0 &&
          !link->gone)
        throw Error(ErrorKind::timeout,
                    {.peer = 1,
                     .operation = "publisher flush",
                     .cause = link->name() + " still has " + std::to_string(link->queued) +
                              " messages queued"});
    }
  }
  // A payload sent from the message's memory travels by rendezvous: it is read when the
  // subscriber takes it, and the memory must stay valid until then (publish()'s promise ends
  // with flush()). The connections' threads drive the transfers.
  for (const auto& link : links) {
    while (link->in_flight->load() > 0) {
      {
        std::lock_guard l(link->mu);
        if (link->gone) break;
      }
      if (std::chrono::steady_clock::now() >= deadline)
        throw Error(ErrorKind::timeout,
                    {.peer = 1,
                     .operation = "publisher flush",
                     .cause = link->name() + " has not taken " +
                              std::to_string(link->in_flight->load()) + " sends yet"});
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

void PublisherImpl::close() {
  if (closed_.exchange(true)) return;
  // Publishes that passed the check before closed_ was set finish first (a blocking one waits
  // at most block_timeout_ in all); later ones see it and raise. (Threads that keep taking the
  // lock shared, polling stats() say, can hold this back: the lock prefers them.)
  { std::unique_lock wait_for_publishes(links_mu_); }
  try {
    flush(block_timeout_);
  } catch (const Error& e) {
    base::log("pubsub", base::LogLevel::warn, "publisher at ", address(),
              " closes with messages unsent: ", e.what());
  }
  {
    // Exclusive: a subscriber's thread lists its link before this (and its end is sent here)
    // or sees streams_ended_ after it (and sends its end itself).
    std::unique_lock lock(links_mu_);
    streams_ended_ = true;
    for (const auto& link : links_) {
      std::lock_guard l(link->mu);
      if (link->gone) continue;
      // The end of the stream: the last sequence, so the subscriber counts trailing drops,
      // those still queued here included (the flush above gave up on them): dropped, so that
      // credit that comes later sends nothing (a batch after the end would reach no one; no
      // publish queues anything now, closed_ is set).
      link->dropped += link->queued;
      link->pending.clear();
      link->queued = 0;
      try {
        link->in_flight->fetch_add(1);
        patterns::send_owned(link->comm, 1, ps::batch_tag, ps::encode_end(link->sequence),
                             [count = link->in_flight] { --*count; });
      } catch (const Error&) {
      }
    }
  }
  // Until the subscribers have taken what is in flight (their connections' threads drive it).
  const auto deadline = std::chrono::steady_clock::now() + block_timeout_;
  for (;;) {
    bool busy = false;
    {
      std::shared_lock lock(links_mu_);
      for (const auto& link : links_) busy = busy || link->in_flight->load() > 0;
    }
    if (!busy || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  listener_->stop();
}

Publisher::Stats PublisherImpl::stats() const {
  Publisher::Stats s;
  s.published = published_.load(std::memory_order_relaxed);
  s.timed_out = timed_out_.load(std::memory_order_relaxed);
  std::shared_lock lock(links_mu_);
  s.sent = sent_gone_;
  s.dropped = dropped_gone_;
  for (const auto& link : links_) {
    std::lock_guard l(link->mu);
    s.sent += link->sent;
    s.dropped += link->dropped;
  }
  return s;
}

}  // namespace detail

Publisher::Publisher(std::shared_ptr<detail::PublisherImpl> impl) : impl_(std::move(impl)) {}
Publisher Publisher::listen(const std::string& host_port, PublisherOptions options) {
  return Publisher(std::make_shared<detail::PublisherImpl>(host_port, options));
}
void Publisher::publish(std::string_view topic, const Message& message) {
  impl_->publish(topic, message);
}
void Publisher::flush(std::optional<std::chrono::milliseconds> timeout) {
  impl_->flush(base::timeout_or_default(timeout));
}
void Publisher::close() {
  impl_->close();
}
std::string Publisher::address() const {
  return impl_->address();
}
std::size_t Publisher::subscribers() const {
  return impl_->subscribers();
}
Publisher::Stats Publisher::stats() const {
  return impl_->stats();
}

}  // namespace anview
