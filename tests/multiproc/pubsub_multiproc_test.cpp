// Pub/sub across processes (forked here): a publisher process and a subscriber that connects
// by address, over shared memory or TCP (ANVIEW_TRANSPORTS=tcp in the mp.pubsub.tcp.* tests).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "anview/anview.hpp"
#include "support/child_process.hpp"

namespace {

using namespace std::chrono_literals;
using anview::testing::read_line;
using anview::testing::wait_exit;

constexpr int total = 200000;

// A publisher process: writes its address to `out`, waits for one subscriber, publishes
// `count` messages ("0", "1", ...) and closes (count < 0: publishes until killed).
pid_t start_publisher(int& address_fd, int count) {
  const auto child = anview::testing::fork_child("publisher", [count](int out) {
    anview::Publisher publisher = anview::Publisher::listen("127.0.0.1:0");
    anview::testing::write_line(out, publisher.address());
    while (publisher.subscribers() < 1) std::this_thread::sleep_for(1ms);
    for (long i = 0; count < 0 || i < count; ++i)
      publisher.publish("t", anview::Message(std::to_string(i)));
    publisher.close();
    return 0;
  });
  address_fd = child.fd;
  return child.pid;
}

void slow_subscriber(anview::Backpressure policy) {
  int fd;
  const pid_t publisher = start_publisher(fd, total);
  const std::string address = read_line(fd);
  ASSERT_FALSE(address.empty());
  anview::Subscriber s =
      anview::Subscriber::connect(address, {.policy = policy, .window = 256, .queue_limit = 1000});
  std::uint64_t delivered = 0, last = 0;
  while (auto d = s.next(30s)) {
    ++delivered;
    ASSERT_EQ(d->sequence, last + d->dropped_before + 1);
    ASSERT_EQ(d->message.text(), std::to_string(d->sequence - 1));
    last = d->sequence;
    if (delivered % 10000 == 0) std::this_thread::sleep_for(30ms);  // slow
  }
  const auto stats = s.stats();
  EXPECT_TRUE(stats.ended);
  EXPECT_EQ(stats.delivered, delivered);
  EXPECT_EQ(stats.delivered + stats.dropped, static_cast<std::uint64_t>(total));
  if (policy == anview::Backpressure::block) {
    EXPECT_EQ(stats.dropped, 0u);
  } else {
    EXPECT_GT(stats.dropped, 0u);
  }
  EXPECT_EQ(wait_exit(publisher), 0);
  ::close(fd);
}

TEST(MultiprocPubSub, SlowSubscriberBlockLosesNothing) {
  slow_subscriber(anview::Backpressure::block);
}

TEST(MultiprocPubSub, SlowSubscriberDropOldestCountsEveryDrop) {
  slow_subscriber(anview::Backpressure::drop_oldest);
}

TEST(MultiprocPubSub, PublisherKilledIsAnErrorNamingIt) {
  int fd;
  const pid_t publisher = start_publisher(fd, -1);
  const std::string address = read_line(fd);
  ASSERT_FALSE(address.empty());
  anview::Subscriber s = anview::Subscriber::connect(address);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(s.next(10s));
  ::kill(publisher, SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  try {
    while (s.next(20s)) {
    }
    ADD_FAILURE() << "the stream ended cleanly";
  } catch (const anview::Error& e) {
    EXPECT_TRUE(e.kind() == anview::ErrorKind::peer_lost || e.kind() == anview::ErrorKind::link)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(address), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - killed, 10s);
  wait_exit(publisher);
  ::close(fd);
}

}  // namespace
