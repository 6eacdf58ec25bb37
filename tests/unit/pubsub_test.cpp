// Pub/sub in one process: a publisher listening on loopback, subscribers connecting by address
// (each connection a two-rank communicator, here over shared memory).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "anview/anview.hpp"
#include "patterns/connection.hpp"
#include "patterns/pubsub_frame.hpp"
#include "support/scoped_env.hpp"
#include "support/test_thread.hpp"

namespace anview {
namespace {

using namespace std::chrono_literals;
using testing::test_thread;

// "m<i>" (built by append: GCC 12's -Wrestrict misfires on label(i) at -O3).
std::string label(int i) {
  std::string s("m");
  s.append(std::to_string(i));
  return s;
}

void wait_for_subscribers(const Publisher& publisher, std::size_t n) {
  for (int i = 0; i < 2000 && publisher.subscribers() < n; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(publisher.subscribers(), n);
}

TEST(PubSub, TopicsByPrefixInOrderSmallAndLarge) {
  Publisher publisher = Publisher::listen("127.0.0.1:0");
  Subscriber a = Subscriber::connect(publisher.address(), {.topics = {"a/"}});
  Subscriber all = Subscriber::connect(publisher.address(), {.topics = {""}});
  wait_for_subscribers(publisher, 2);
  const std::string big(3 << 20, 'B');
  for (int i = 0; i < 100; ++i) {
    publisher.publish(i % 2 ? "a/odd" : "b/even", Message(label(i)));
  }
  publisher.publish("a/big", Message(big));
  for (int i = 1; i < 100; i += 2) {
    auto d = a.next(5s);
    ASSERT_TRUE(d);
    EXPECT_EQ(d->topic, "a/odd");
    EXPECT_EQ(d->message.text(), label(i));
    EXPECT_EQ(d->sequence, static_cast<std::uint64_t>(i / 2 + 1));
    EXPECT_EQ(d->dropped_before, 0u);
  }
  auto d = a.next(5s);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->message.text(), big);
  for (int i = 0; i < 100; ++i) {
    auto e = all.next(5s);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->message.text(), label(i));
  }
  EXPECT_EQ(all.next(5s)->message.size(), big.size());
  publisher.close();
  EXPECT_FALSE(a.next(5s).has_value());  // the end of the stream
  EXPECT_TRUE(a.stats().ended);
  EXPECT_EQ(a.stats().delivered, 51u);
  EXPECT_EQ(a.stats().dropped, 0u);
  EXPECT_EQ(publisher.stats().published, 101u);
  EXPECT_EQ(publisher.stats().sent, 51u + 101u);
}

// The longest subscription the protocol allows (64 topics of 256 bytes) is served. Before,
// the publisher received subscribe frames into 4 KiB: a larger one failed its receive, the
// connection was dropped unserved, and the subscriber waited in vain.
TEST(PubSub, ASubscriptionOfSixtyFourLongTopicsIsServed) {
  Publisher publisher = Publisher::listen("127.0.0.1:0");
  std::vector<std::string> topics;
  for (int i = 0; i < 64; ++i) {
    std::string topic(256, 't');
    const std::string tail = label(i);
    topic.replace(topic.size() - tail.size(), tail.size(), tail);
    topics.push_back(topic);
  }
  Subscriber many = Subscriber::connect(publisher.address(), {.topics = topics});
  wait_for_subscribers(publisher, 1);
  publisher.publish(topics[63], Message("hello"));
  auto d = many.next(5s);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->topic, topics[63]);
  EXPECT_EQ(d->message.text(), "hello");
}

// A message over 4 KiB is sent from its own memory, which publish() asks to stay valid until
// flush() returns: after that the memory is the caller's again. Before, flush() returned once
// the payload's send was posted; the subscriber read it (rendezvous) only when it took the
// message, and got what the caller had written there since.
TEST(PubSub, AfterFlushTheMemoryOfALargeMessageIsTheCallersAgain) {
  Publisher publisher = Publisher::listen("127.0.0.1:0");
  Subscriber subscriber = Subscriber::connect(publisher.address(), {.topics = {""}});
  wait_for_subscribers(publisher, 1);
  std::vector<char> memory(1 << 20, 'A');
  publisher.publish("t", Message::view(memory.data(), memory.size()));
  std::jthread taker = test_thread([&] {
    std::this_thread::sleep_for(50ms);  // takes it a while after publish()
    auto d = subscriber.next(5s);
    ASSERT_TRUE(d);
    const auto bytes = d->message.bytes();
    EXPECT_EQ(std::count(bytes.begin(), bytes.end(), std::byte{'A'}),
              static_cast<std::ptrdiff_t>(memory.size()))
        << "the subscriber got bytes written after flush() returned";
  });
  publisher.flush(5s);
  std::fill(memory.begin(), memory.end(), 'B');
  taker.join();
}

// A queue limit of 0 is refused when subscribing. It was accepted and broke both policies:
// drop_oldest dropped every message, even with credit to send it, and block made every
// publish() wait out its timeout.
TEST(PubSub, AQueueLimitOfZeroIsAUsageError) {
  Publisher publisher = Publisher::listen("127.0.0.1:0");
  SubscribeOptions options;
  options.topics = {""};
  options.queue_limit = 0;
  try {
    Subscriber::connect(publisher.address(), options);
    FAIL() << "a queue limit of 0 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::usage) << e.what();
    EXPECT_NE(std::string(e.what()).find("queue limit above 0"), std::string::npos) << e.what();
  }
}

TEST(PubSub, LateSubscriberStartsAtTheNextMessage) {
  Publisher publisher = Publisher::listen("127.0.0.1:0");
  for (int i = 0; i < 10; ++i) publisher.publish("t", Message("early"));
  Subscriber s = Subscriber::connect(publisher.address());
  wait_for_subscribers(publisher, 1);
  publisher.publish("t", Message("first"));
  auto d = s.next(5s);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->message.text(), "first");
  EXPECT_EQ(d->sequence, 1u);
  EXPECT_EQ(d->dropped_before, 0u);
}

TEST(PubSub, SlowSubscriberBlockPolicyLosesNothing) {
  Publisher publisher = Publisher::listen("127.0.0.1:0");
  Subscriber s = Subscriber::connect(
      publisher.address(), {.policy = Backpressure::block, .window = 64, .queue_limit = 100});
  wait_for_subscribers(publisher, 1);
  constexpr int total = 20000;
  std::jthread pub = test_thread([&] {
    for (int i = 0; i < total; ++i) publisher.publish("t", Message(std::to_string(i)));
    publisher.close();
  });
  int expect = 0;
  while (auto d = s.next(10s)) {
    ASSERT_EQ(d->message.text(), std::to_string(expect)) << "message out of order or lost";
    ++expect;
    if (expect % 2000 == 0) std::this_thread::sleep_for(20ms);  // slow
  }
  pub.join();
  EXPECT_EQ(expect, total);
  EXPECT_EQ(s.stats().delivered, static_cast<std::uint64_t>(total));
  EXPECT_EQ(s.stats().dropped, 0u);
  EXPECT_EQ(publisher.stats().dropped, 0u);
}

// close() on one thread while another publishes: every publish() that returned is delivered,
// the others raise a usage Error. Before, a publish that had passed the closed check as close()
// began could queue its message after the end of the stream: it returned, and the message was
// never delivered.
TEST(PubSub, EveryPublishThatReturnsWhileAnotherThreadClosesIsDelivered) {
  for (int round = 0; round < 60; ++round) {
    SCOPED_TRACE(round);
    Publisher publisher = Publisher::listen("127.0.0.1:0");
    Subscriber s = Subscriber::connect(publisher.address());
    wait_for_subscribers(publisher, 1);
    std::atomic<int> published{0};
    std::jthread pub = test_thread([&] {
      try {
        for (int i = 0;; ++i) {
          publisher.publish("t", Message(std::to_string(i)));
          ++published;
        }
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::usage) << e.what();
      }
    });
    int got = 0;
    std::jthread sub = test_thread([&] {
      while (auto d = s.next(10s)) ++got;
    });
    std::this_thread::sleep_for(std::chrono::microseconds(100 + round * 97 % 900));
    publisher.close();
    pub.join();
    sub.join();
    ASSERT_EQ(got, published.load()) << "a message published before close() was lost";
  }
}

// milliseconds::max() as next()'s timeout means no end: added to now() as it was, it overflowed
// into a deadline in the past, and next() raised a timeout at once.
TEST(PubSub, ANextWithoutEndWaitsForTheMessage) {
  Publisher publisher = Publisher::listen("127.0.0.1:0");
  Subscriber subscriber = Subscriber::connect(publisher.address());
  wait_for_subscribers(publisher, 1);
  std::jthread late = test_thread([&] {
    std::this_thread::sleep_for(100ms);
    publisher.publish("t", Message("late"));
  });
  const auto d = subscriber.next(std::chrono::milliseconds::max());
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->message.text(), "late");
}

// close() ends a stream whose subscriber gave no credit in time: its flush times out, the end
// goes out with the messages still queued counted as dropped. Credit that comes after the end
// (the subscriber takes what it has) sends nothing more: a batch after the end would reach no
// one and hold close() up (the large payload in flight keeps close() waiting meanwhile).
TEST(PubSub, CreditThatComesAfterTheEndOfTheStreamSendsNothing) {
  Publisher publisher = Publisher::listen("127.0.0.1:0", {.block_timeout = 2000ms});
  Subscriber subscriber = Subscriber::connect(publisher.address());
  wait_for_subscribers(publisher, 1);
  // The first four publishes go out at once, a batch each (the first credit); the large one is
  // sent apart, by rendezvous. The other 197 wait, about 21 to a batch.
  publisher.publish("t", Message(std::string(1 << 20, 'L')));
  const std::string small(3000, 's');
  for (int i = 0; i < 200; ++i) publisher.publish("t", Message(small));
  std::jthread closing = test_thread([&] { publisher.close(); });
  // The flush has timed out and the end is out; close() waits for the large payload until
  // 2 s after that, which the subscriber takes first.
  std::this_thread::sleep_for(2600ms);
  std::uint64_t delivered = 0;
  while (auto d = subscriber.next(5s)) ++delivered;
  closing.join();
  EXPECT_GT(delivered, 1u);
  EXPECT_LT(delivered, 201u);
  EXPECT_EQ(publisher.stats().sent, delivered) << "a batch was sent after the end";
  EXPECT_EQ(publisher.stats().dropped, 201u - delivered);
  EXPECT_EQ(subscriber.stats().delivered, delivered);
  EXPECT_EQ(subscriber.stats().dropped, 201u - delivered);
}

// Threads that keep publishing (or polling stats()) take the links' lock shared, one after
// another: a subscriber that connects meanwhile, and close(), take it exclusively and must
// still get it.
TEST(PubSub, ASubscriberThatConnectsWhileThreadsKeepPublishingIsServed) {
  Publisher publisher = Publisher::listen("127.0.0.1:0");
  Subscriber first = Subscriber::connect(publisher.address(), {.topics = {"elsewhere"}});
  wait_for_subscribers(publisher, 1);
  std::atomic<bool> stop{false};
  std::atomic<long> published{0};
  std::vector<std::jthread> threads;
  // They stop on their own after 20 s: a test that fails must not hang.
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      try {
        while (!stop.load() && std::chrono::steady_clock::now() < give_up) {
          if (t == 2) {
            (void)publisher.stats();
          } else {
            publisher.publish("t", Message("x"));
            ++published;
          }
        }
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::usage) << e.what();  // closed
      }
    });
  }
  while (published.load() < 1000) std::this_thread::sleep_for(1ms);
  // It takes everything until the end of the stream (close() flushes to it first).
  Subscriber late = Subscriber::connect(publisher.address(),
                                        {.topics = {"t"}, .policy = Backpressure::drop_oldest});
  const auto start = std::chrono::steady_clock::now();
  std::atomic<long> got{0};
  std::jthread reader = test_thread([&] {
    while (late.next(10s)) ++got;
  });
  while (got.load() == 0 && std::chrono::steady_clock::now() - start < 10s)
    std::this_thread::sleep_for(1ms);
  EXPECT_GT(got.load(), 0) << "the subscriber that connected while threads kept publishing got "
                              "nothing within 10 s";
  const auto closing = std::chrono::steady_clock::now();
  publisher.close();  // while the stats() thread goes on
  EXPECT_LT(std::chrono::steady_clock::now() - closing, 5s);
  stop = true;
  for (auto& t : threads) t.join();
  reader.join();
}

TEST(PubSub, SlowSubscriberDropOldestCountsEveryDrop) {
  Publisher publisher = Publisher::listen("127.0.0.1:0");
  Subscriber s = Subscriber::connect(
      publisher.address(), {.policy = Backpressure::drop_oldest, .window = 64, .queue_limit = 100});
  wait_for_subscribers(publisher, 1);
  constexpr int total = 20000;
  for (int i = 0; i < total; ++i) publisher.publish("t", Message(std::to_string(i)));
  std::uint64_t delivered = 0, gaps = 0, last = 0;
  std::jthread closer = test_thread([&] {
    std::this_thread::sleep_for(200ms);
    publisher.close();
  });
  while (auto d = s.next(10s)) {
    ++delivered;
    gaps += d->dropped_before;
    EXPECT_EQ(d->sequence, last + d->dropped_before + 1);
    EXPECT_EQ(d->message.text(), std::to_string(d->sequence - 1));
    last = d->sequence;
  }
  closer.join();
  const auto stats = s.stats();
  EXPECT_EQ(stats.delivered, delivered);
  EXPECT_GT(stats.dropped, 0u);
  EXPECT_EQ(stats.delivered + stats.dropped, static_cast<std::uint64_t>(total));
  EXPECT_EQ(publisher.stats().dropped, stats.dropped);
  EXPECT_GE(stats.dropped, gaps);
}

TEST(PubSub, BlockedPublisherTimesOutNamingTheSubscriber) {
  Publisher publisher = Publisher::listen("127.0.0.1:0", {.block_timeout = 300ms});
  Subscriber s = Subscriber::connect(publisher.address(), {.window = 8, .queue_limit = 16});
  wait_for_subscribers(publisher, 1);
  try {
    for (int i = 0; i < 100000; ++i) publisher.publish("t", Message("x"));
    FAIL() << "publish never blocked";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::timeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("subscriber connection"), std::string::npos) << e.what();
  }
}

// One stalled blocking subscriber does not cut the others off: the publish that times out on it
// still reaches the other subscribers of the topic, and its Error says so. Before, the publish
// raised at the stalled one, and the subscribers after it never got that message.
TEST(PubSub, APublishThatTimesOutOnOneSubscriberStillReachesTheOthers) {
  Publisher publisher = Publisher::listen("127.0.0.1:0", {.block_timeout = 300ms});
  Subscriber stalled = Subscriber::connect(publisher.address(), {.window = 8, .queue_limit = 16});
  wait_for_subscribers(publisher, 1);
  Subscriber reader = Subscriber::connect(publisher.address());  // after it in the publisher's list
  wait_for_subscribers(publisher, 2);
  int last = -1;
  try {
    for (int i = 0; i < 100000; ++i) {
      last = i;
      publisher.publish("t", Message(std::to_string(i)));
    }
    FAIL() << "publish never blocked";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::timeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("did not get this message; the 1 other subscriber of the "
                                         "topic did"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(publisher.stats().timed_out, 1u);
  int expect = 0;
  while (expect <= last) {
    auto d = reader.next(5s);
    ASSERT_TRUE(d) << "message " << expect << " of " << last << " did not reach the reader";
    ASSERT_EQ(d->message.text(), std::to_string(expect));
    ++expect;
  }
}

// An explicit zero timeout polls: next(0ms) says at once that nothing is there, and returns a
// message that is. Before, zero meant ANVIEW_TIMEOUT, so next(0ms) waited for it.
TEST(PubSub, NextWithAZeroTimeoutPolls) {
  Publisher publisher = Publisher::listen("127.0.0.1:0");
  Subscriber s = Subscriber::connect(publisher.address());
  wait_for_subscribers(publisher, 1);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(s.next(0ms), Error);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  publisher.publish("t", Message("here"));
  publisher.flush();
  std::optional<Delivery> d;
  for (int i = 0; i < 5000 && !d; ++i) {
    try {
      d = s.next(0ms);
    } catch (const Error& e) {
      ASSERT_EQ(e.kind(), ErrorKind::timeout) << e.what();
      std::this_thread::sleep_for(1ms);
    }
  }
  ASSERT_TRUE(d);
  EXPECT_EQ(d->message.text(), "here");
}

// stats() answers while another thread waits in next(). Before, both took one lock, and a
// monitoring thread's stats() waited out the other's next(): here until its timeout.
TEST(PubSub, StatsAnswerWhileAnotherThreadWaitsInNext) {
  Publisher publisher = Publisher::listen("127.0.0.1:0");
  Subscriber s = Subscriber::connect(publisher.address());
  wait_for_subscribers(publisher, 1);
  std::atomic<bool> entered{false};
  std::jthread waiter = test_thread([&] {
    entered = true;
    EXPECT_THROW(s.next(4s), Error);  // nothing is published
  });
  while (!entered.load()) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(200ms);  // it is waiting in next() by now
  const auto start = std::chrono::steady_clock::now();
  const Subscriber::Stats stats = s.stats();
  // next() waits 3.8 s more: a stats() that waited for it takes that long.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s) << "stats() waited for next()";
  EXPECT_EQ(stats.delivered, 0u);
  EXPECT_FALSE(stats.ended);
}

// Messages sent apart (over 4 KiB) and inline ones, mixed in one batch, come in order and
// whole; next() waits for a payload within its own timeout.
TEST(PubSub, LargeAndSmallMessagesOfOneBatchComeInOrder) {
  // A short block timeout bounds close(), joined at the end, should the reader stop early.
  Publisher publisher = Publisher::listen("127.0.0.1:0", {.block_timeout = 5s});
  Subscriber s = Subscriber::connect(publisher.address());
  wait_for_subscribers(publisher, 1);
  for (int i = 0; i < 40; ++i) {
    const std::size_t bytes = i % 3 == 0 ? (std::size_t{64} << 10) + i : 16 + i;
    std::vector<std::byte> m(bytes, static_cast<std::byte>(i));
    publisher.publish("t", Message(std::move(m)));
  }
  std::jthread closer = test_thread([&] { publisher.close(); });  // waits for the reader
  int i = 0;
  while (auto d = s.next(10s)) {
    const std::size_t bytes = i % 3 == 0 ? (std::size_t{64} << 10) + i : 16 + i;
    ASSERT_EQ(d->message.size(), bytes) << "message " << i;
    const auto b = d->message.bytes();
    EXPECT_EQ(std::count(b.begin(), b.end(), static_cast<std::byte>(i)),
              static_cast<std::ptrdiff_t>(bytes))
        << "message " << i;
    ++i;
  }
  EXPECT_EQ(i, 40);
  EXPECT_EQ(s.stats().delivered, 40u);
}

// The payloads of a batch's larger messages move only while the subscriber progresses, and
// the publisher's flush() waits for them: next() takes in every payload of the batch, not
// only the one it returns.
TEST(PubSub, ANextThatReturnsALargeMessageTakesInTheOthersOfItsBatch) {
  const testing::ScopedEnv tcp("ANVIEW_TRANSPORTS", "tcp");  // bytes move as the reader reads
  Publisher publisher = Publisher::listen("127.0.0.1:0", {.block_timeout = 5s});
  Subscriber s = Subscriber::connect(publisher.address());
  wait_for_subscribers(publisher, 1);
  // The first four take the four batches of credit; the eight after them gather in one.
  for (int i = 0; i < 4; ++i) publisher.publish("t", Message("small"));
  std::vector<char> memory(8 << 16, 'x');
  for (int i = 0; i < 8; ++i)
    publisher.publish("t", Message::view(memory.data() + (i << 16), 1 << 16));
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(s.next(10s)) << "message " << i;
  EXPECT_NO_THROW(publisher.flush(5s)) << "the other payloads were left untaken";
  for (int i = 5; i < 12; ++i) ASSERT_TRUE(s.next(10s)) << "message " << i;
}

// A fake publisher for one subscriber: a batch of one message of `announced` bytes sent
// apart, then, once `release` is set (or after 3 s), a payload of `sent` bytes. The link
// stays up until the fake is destroyed.
class OneMessagePublisher {
 public:
  OneMessagePublisher(std::size_t announced, std::size_t sent)
      : listener_("127.0.0.1:0", "pubsub", 10s, [=, this](Communicator comm, std::uint64_t) {
          namespace ps = patterns::pubsub;
          std::vector<std::byte> subscription(ps::max_subscribe_bytes);
          comm.recv(subscription.data(), subscription.size(), 1, ps::control_tag, 10s);
          ps::BatchWriter writer;
          const std::vector<std::byte> entry(announced);
          writer.add(1, "t", entry, /*apart=*/true);
          const auto frame = writer.frame();
          comm.send(frame.data(), frame.size(), 1, ps::batch_tag, 10s);
          const auto give_up = std::chrono::steady_clock::now() + 3s;
          while (!release && std::chrono::steady_clock::now() < give_up)
            std::this_thread::sleep_for(1ms);
          const std::vector<std::byte> payload(sent, std::byte{7});
          comm.send(payload.data(), payload.size(), 1, ps::payload_tag, 10s);
          while (!done_ && !listener_.stopping()) std::this_thread::sleep_for(1ms);
        }) {}
  ~OneMessagePublisher() { done_ = true; }
  std::string address() const { return listener_.address(); }
  std::atomic<bool> release{false};

 private:
  std::atomic<bool> done_{false};
  patterns::Listener listener_;  // last: its thread uses the members above
};

// A payload sent apart that comes shorter than its entry says is a protocol error. Before, the
// message was delivered at the entry's length, its end zeros.
TEST(PubSub, APayloadThatComesShortIsAProtocolError) {
  OneMessagePublisher fake(8192, 100);
  fake.release = true;
  Subscriber s = Subscriber::connect(fake.address());
  try {
    const auto d = s.next(10s);
    ADD_FAILURE() << "a message of " << (d ? d->message.size() : 0) << " bytes was delivered";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::protocol) << e.what();
    EXPECT_NE(std::string(e.what()).find("came short"), std::string::npos) << e.what();
  }
}

// next() waits for a payload sent apart within its own timeout, and the message stays first in
// line for the next call. Before, the payload was received with ANVIEW_TIMEOUT whatever
// next()'s timeout (here: until the fake gave up holding it back, 3 s later).
TEST(PubSub, ATimeoutWhileAPayloadIsOnItsWayKeepsItsMessageFirstInLine) {
  OneMessagePublisher fake(8192, 8192);
  Subscriber s = Subscriber::connect(fake.address());
  const auto start = std::chrono::steady_clock::now();
  try {
    s.next(300ms);
    ADD_FAILURE() << "a message came before its payload was sent";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::timeout) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s) << "next(300ms) waited longer";
  fake.release = true;
  const auto d = s.next(10s);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->sequence, 1u);
  ASSERT_EQ(d->message.size(), 8192u);
  EXPECT_EQ(d->message.bytes()[8191], std::byte{7});
}

// A subscriber that connects while the publisher closes gets the end of its stream, like the
// others: next() returns no message. Before, close() ended only the streams it had listed; a
// connection whose subscription came later (or whose thread still waited for it) was closed
// under it, and next() raised a connection error, as for a publisher that died.
TEST(PubSub, ASubscriberThatConnectsWhilePublisherClosesGetsTheEndOfItsStream) {
  for (int i = 0; i < 20; ++i) {
    SCOPED_TRACE(i);
    Publisher publisher = Publisher::listen("127.0.0.1:0", {.block_timeout = 2s});
    Subscriber s = Subscriber::connect(publisher.address());
    publisher.close();  // no wait for the subscription to be listed
    EXPECT_EQ(s.next(5s), std::nullopt);
  }
}

// The same where the subscription has not come at all when the publisher stops: its
// connection's thread, waiting for it, sends the end itself.
TEST(PubSub, AConnectionWhoseSubscriptionHasNotComeGetsTheEndWhenThePublisherCloses) {
  namespace ps = patterns::pubsub;
  Publisher publisher = Publisher::listen("127.0.0.1:0", {.block_timeout = 2s});
  Communicator raw = patterns::connect_to(publisher.address(), "pubsub", 10s);
  std::vector<std::byte> frame(ps::header_bytes + 64);
  Request r = raw.irecv(frame.data(), frame.size(), 0, ps::batch_tag);
  publisher.close();
  const Status st = r.wait(5s);
  ps::Header h;
  std::string why;
  ASSERT_TRUE(ps::parse_header({frame.data(), st.bytes}, h, why)) << why;
  EXPECT_EQ(h.kind, ps::Kind::end);
  EXPECT_EQ(h.value, 0u);
}

// A subscriber allocates a batch's payloads sent apart when it takes the batch: a batch that
// sends several apart is refused past what a publisher puts in one (4 MiB), so a 64 KiB frame
// cannot make it allocate thousands of large buffers. One payload alone may be larger.
TEST(PubSub, ABatchSendingMorePayloadsApartThanAPublisherWouldIsRefused) {
  namespace ps = patterns::pubsub;
  std::vector<ps::Entry> entries;
  std::string why;
  ps::BatchWriter honest;
  for (std::uint64_t i = 1; i <= 4; ++i) honest.add_apart(i, "t", 1 << 20);
  EXPECT_TRUE(ps::parse_batch(honest.frame(), 64 << 20, entries, why)) << why;
  ps::BatchWriter alone;
  alone.add_apart(1, "t", 16 << 20);
  EXPECT_TRUE(ps::parse_batch(alone.frame(), 64 << 20, entries, why)) << why;
  ps::BatchWriter hostile;
  for (std::uint64_t i = 1; i <= 5; ++i) hostile.add_apart(i, "t", 1 << 20);
  EXPECT_FALSE(ps::parse_batch(hostile.frame(), 64 << 20, entries, why));
  EXPECT_NE(why.find("payload bytes apart (limit 4194304"), std::string::npos) << why;
}

// A message over the subscriber's max_message_bytes (which the publisher does not know) is
// skipped and counted as dropped; the subscription goes on. Before, the whole batch was
// refused as a protocol error, every later next() raised it again, and the messages after it
// never came.
TEST(PubSub, AMessageOverTheSubscribersLimitIsDroppedAndTheStreamGoesOn) {
  Publisher publisher = Publisher::listen("127.0.0.1:0", {.block_timeout = 5s});
  Subscriber s = Subscriber::connect(publisher.address(), {.max_message_bytes = 1000});
  wait_for_subscribers(publisher, 1);
  // Sent apart eagerly and by rendezvous (whose refusal fails the publisher's send), inline.
  const std::string apart(10000, 'A'), rendezvous(200000, 'R'), inline_one(2000, 'I');
  publisher.publish("t", Message(apart));
  publisher.publish("t", Message("small"));
  publisher.publish("t", Message(inline_one));
  publisher.publish("t", Message("after"));
  publisher.publish("t", Message(rendezvous));
  publisher.publish("t", Message("last"));
  publisher.publish("t", Message(apart));
  auto closing = test_thread([&] { publisher.close(); });  // its flush needs the reader
  for (const char* want : {"small", "after", "last"}) {
    const auto d = s.next(5s);
    ASSERT_TRUE(d) << want;
    EXPECT_EQ(d->message.text(), want);
    EXPECT_EQ(d->dropped_before, 1u) << want;
  }
  EXPECT_EQ(s.next(5s), std::nullopt);
  EXPECT_EQ(s.stats().delivered, 3u);
  EXPECT_EQ(s.stats().dropped, 4u);  // the trailing one by the end of the stream
  closing.join();
  EXPECT_EQ(publisher.stats().timed_out, 0u);
}

TEST(PubSub, SubscribingToAnRpcServerIsAClearError) {
  RpcServer server = RpcServer::listen("127.0.0.1:0");
  try {
    Subscriber::connect(server.address(), {.connect_timeout = 2s});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::usage);
    EXPECT_NE(std::string(e.what()).find("serves rpc, not pubsub"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace anview
