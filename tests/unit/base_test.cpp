// base/: error messages, settings parsing, the progress engine.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "anview/error.hpp"
#include "base/config.hpp"
#include "base/huge_pages.hpp"
#include "base/limits.hpp"
#include "base/log.hpp"
#include "base/progress_engine.hpp"
#include "base/shared_segment.hpp"
#include "base/socket.hpp"
#include "base/ticks.hpp"
#include "support/expect_error.hpp"
#include "support/pidfds.hpp"

namespace anview::base {
namespace {

using anview::testing::expect_error;

TEST(Error, MessageNamesKindRankPeerOperationTagAndCause) {
  const Error e(ErrorKind::peer_lost, {.rank = 2,
                                       .peer = 5,
                                       .peer_address = "10.0.0.5:4000",
                                       .operation = "recv",
                                       .tag = 9,
                                       .cause = "gone"});
  EXPECT_STREQ(e.what(),
               "anview peer_lost error on rank 2 with peer 5 (10.0.0.5:4000) in recv tag=9: gone");
  EXPECT_EQ(e.kind(), ErrorKind::peer_lost);
  EXPECT_EQ(e.rank(), 2);
  EXPECT_EQ(e.peer(), 5);
}

TEST(Error, ForOperationKeepsTheRootCause) {
  const Error root(ErrorKind::peer_lost,
                   {.rank = 0, .peer = 1, .operation = "transfer", .cause = "connection closed"});
  const Error later = root.for_operation("send", 7);
  EXPECT_EQ(later.kind(), ErrorKind::peer_lost);
  EXPECT_EQ(later.operation(), "send");
  EXPECT_EQ(later.context().tag, 7u);
  EXPECT_NE(std::string(later.what()).find("earlier failure in transfer: connection closed"),
            std::string::npos)
      << later.what();
}

// A log line carries the time, the rank (or pid) and the component, then level and message.
TEST(Log, LineCarriesTimeRankAndComponent) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const int saved = ::dup(STDERR_FILENO);
  ::dup2(fds[1], STDERR_FILENO);
  base::log_line("tcp", base::LogLevel::warn, "link to rank 2 is slow");
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  ::close(fds[1]);
  char buf[512] = {};
  const ssize_t n = ::read(fds[0], buf, sizeof buf - 1);
  ::close(fds[0]);
  ASSERT_GT(n, 0);
  const std::string line(buf, static_cast<std::size_t>(n));
  EXPECT_TRUE(std::regex_match(
      line, std::regex(R"(\[anview \d\d:\d\d:\d\d\.\d{6} (rank \d+|pid \d+) tcp\] warn: )"
                       R"(link to rank 2 is slow\n)")))
      << line;
}

// Under a flood only a burst per interval is logged; the next logged line counts the rest.
TEST(Limits, DropLogLogsABurstPerIntervalAndCountsTheRest) {
  limits::DropLog drops(std::chrono::milliseconds(200), 3);
  int logged = 0;
  for (int i = 0; i < 10; ++i) logged += drops.log("tcp", "dropped one") ? 1 : 0;
  EXPECT_EQ(logged, 3);
  EXPECT_EQ(drops.suppressed(), 7u);
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_TRUE(drops.log("tcp", "dropped one more"));
  EXPECT_EQ(drops.suppressed(), 7u);
}

TEST(Limits, DefaultsAndRanges) {
  EXPECT_EQ(limits::max_frame_bytes(), 64u << 20);
  EXPECT_EQ(limits::handshake_timeout(), std::chrono::seconds(10));
  EXPECT_EQ(limits::max_pending_connections(), 128u);
  ::setenv("ANVIEW_MAX_FRAME", "1K", 1);
  EXPECT_EQ(expect_error([] { limits::max_frame_bytes(); }).kind(), ErrorKind::usage);
  ::setenv("ANVIEW_MAX_FRAME", "256K", 1);
  EXPECT_EQ(limits::max_frame_bytes(), 256u << 10);
  ::unsetenv("ANVIEW_MAX_FRAME");
  ::setenv("ANVIEW_MAX_PENDING_CONNECTIONS", "0", 1);
  const Error e = expect_error([] { limits::max_pending_connections(); });
  EXPECT_NE(e.cause().find("ANVIEW_MAX_PENDING_CONNECTIONS='0' is out of range"), std::string::npos)
      << e.what();
  ::unsetenv("ANVIEW_MAX_PENDING_CONNECTIONS");
  ::setenv("ANVIEW_HANDSHAKE_TIMEOUT", "250ms", 1);
  EXPECT_EQ(limits::handshake_timeout(), std::chrono::milliseconds(250));
  ::unsetenv("ANVIEW_HANDSHAKE_TIMEOUT");
}

// Ticks (the TSC where invariant) convert to the steady clock's durations.
TEST(Ticks, DurationsMatchTheSteadyClock) {
  const double ratio = base::ns_per_tick();
  EXPECT_GT(ratio, 0.01);  // a 100 GHz counter at most
  EXPECT_LT(ratio, 1000.0);
  const auto t0 = std::chrono::steady_clock::now();
  const std::int64_t c0 = base::ticks();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::int64_t c1 = base::ticks();
  const double steady_ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  const double ticks_ns = base::ticks_to_ns(c1 - c0);
  EXPECT_GT(ticks_ns, 0.9 * steady_ns - 1e5) << (base::ticks_are_tsc ? "tsc" : "steady clock");
  EXPECT_LT(ticks_ns, 1.1 * steady_ns + 1e5) << (base::ticks_are_tsc ? "tsc" : "steady clock");
}

TEST(Config, SizesAcceptSuffixes) {
  EXPECT_EQ(parse_size("0", "X"), 0);
  EXPECT_EQ(parse_size("64K", "X"), 65536);
  EXPECT_EQ(parse_size("3M", "X"), 3 << 20);
  EXPECT_EQ(parse_size("2GiB", "X"), 2LL << 30);
  EXPECT_EQ(parse_size("16m", "X"), 16 << 20);
}

TEST(Config, MalformedValuesAreUsageErrorsNamingTheVariable) {
  for (const char* bad : {"", "abc", "-1", "12Q", "4KK", "99999999999999999999"}) {
    try {
      parse_size(bad, "ANVIEW_SOMETHING");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::usage);
      EXPECT_NE(std::string(e.what()).find("ANVIEW_SOMETHING"), std::string::npos);
    }
  }
}

TEST(Config, Durations) {
  using namespace std::chrono_literals;
  EXPECT_EQ(parse_duration("30", "X"), 30s);
  EXPECT_EQ(parse_duration("1.5s", "X"), 1500ms);
  EXPECT_EQ(parse_duration("250ms", "X"), 250ms);
  EXPECT_EQ(parse_duration("2m", "X"), 120s);
  EXPECT_THROW(parse_duration("soon", "X"), Error);
  EXPECT_THROW(parse_duration("5h", "X"), Error);
  // Found by fuzz_config: values past int64 milliseconds (or not numbers at all) were cast
  // to an integer regardless, which is undefined behaviour.
  EXPECT_THROW(parse_duration("333333333333333333333", "X"), Error);
  EXPECT_THROW(parse_duration("1e400ms", "X"), Error);
  EXPECT_THROW(parse_duration("nan", "X"), Error);
  EXPECT_THROW(parse_duration("inf", "X"), Error);
  EXPECT_THROW(parse_duration("11y", "X"), Error);
  EXPECT_NO_THROW(parse_duration("5256000m", "X"));  // 10 years of 365 days
}

const Setting test_setting("test", "ANVIEW_TEST_ONLY_SETTING", "a, b,,c ", "for tests");

TEST(Config, SettingsRegisterAndReadTheEnvironment) {
  bool found = false;
  for (const Setting* s : all_settings())
    found |= std::string(s->env()) == "ANVIEW_TEST_ONLY_SETTING";
  EXPECT_TRUE(found);
  ::unsetenv("ANVIEW_TEST_ONLY_SETTING");
  EXPECT_FALSE(test_setting.from_environment());
  EXPECT_EQ(test_setting.as_list(), (std::vector<std::string>{"a", "b", "c"}));
  ::setenv("ANVIEW_TEST_ONLY_SETTING", "yes", 1);
  EXPECT_TRUE(test_setting.from_environment());
  EXPECT_TRUE(test_setting.as_bool());
  ::setenv("ANVIEW_TEST_ONLY_SETTING", "maybe", 1);
  EXPECT_THROW(test_setting.as_bool(), Error);
  ::unsetenv("ANVIEW_TEST_ONLY_SETTING");
}

// An eventfd (readable from the start when `initial` > 0) and a handler that drains it and
// counts its calls.
class CountingHandler final : public FdHandler {
 public:
  explicit CountingHandler(unsigned initial = 0) : efd(::eventfd(initial, EFD_NONBLOCK)) {}
  void on_fd_events(std::uint32_t) override {
    std::uint64_t v;
    [[maybe_unused]] ssize_t n = ::read(fd(), &v, sizeof v);
    ++calls;
  }
  int fd() const { return efd.get(); }
  Fd efd;
  int calls = 0;
};

TEST(ProgressEngine, DispatchesReadyFdsAndPollers) {
  ProgressEngine engine;
  CountingHandler handler;
  engine.add_fd(handler.fd(), EPOLLIN, &handler);
  int polls = 0;
  engine.add_poller([&] { return ++polls < 0; });
  EXPECT_FALSE(engine.poll(0));  // nothing ready
  const std::uint64_t one = 1;
  ASSERT_EQ(::write(handler.fd(), &one, sizeof one), 8);
  EXPECT_TRUE(engine.poll(100));
  EXPECT_EQ(handler.calls, 1);
  EXPECT_EQ(polls, 2);
  engine.remove_fd(handler.fd());
}

// A spinning owner's round after a hint said yes runs the pollers with work (and those
// without a hint), not every transport's; a full round runs them all.
TEST(ProgressEngine, AHintedRoundSkipsPollersWhoseHintSaysNo) {
  ProgressEngine engine;
  bool shm_has_work = false, tcp_has_work = false;
  int shm = 0, tcp = 0, unhinted = 0;
  engine.add_poller([&] { return ++shm > 0; }, [&] { return shm_has_work; });
  engine.add_poller([&] { return ++tcp > 0; }, [&] { return tcp_has_work; });
  engine.add_poller([&] { return ++unhinted < 0; });
  shm_has_work = true;
  EXPECT_TRUE(engine.run_pollers(/*hinted_only=*/true));
  EXPECT_EQ(shm, 1);
  EXPECT_EQ(tcp, 0);
  EXPECT_EQ(unhinted, 1);
  shm_has_work = false;
  EXPECT_FALSE(engine.run_pollers(/*hinted_only=*/true));  // only the unhinted one ran
  EXPECT_EQ(unhinted, 2);
  EXPECT_TRUE(engine.run_pollers());
  EXPECT_EQ(shm, 2);
  EXPECT_EQ(tcp, 1);
  EXPECT_EQ(unhinted, 3);
}

TEST(ProgressEngine, WakeupEndsASleepingPoll) {
  ProgressEngine engine;
  engine.wakeup();
  const auto start = Clock::now();
  engine.poll(5000);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(1));
}

// The wakeup is drained by the round that sees it: the next round finds nothing to do, so an
// idle owner sleeps instead of spinning. (With a null marker for the wakeup fd, which the
// dispatch skipped as a removed handler, every later round woke at once.)
TEST(ProgressEngine, AWakeupIsDrainedByTheRoundThatSeesIt) {
  ProgressEngine engine;
  engine.wakeup();
  EXPECT_TRUE(engine.poll(0));
  EXPECT_FALSE(engine.poll(0));
  EXPECT_FALSE(engine.poll(10));
}

// An owner that sleeps in wait_events() without its lock and dispatches under it: a handler
// removed by name in between (another thread closed a link under the lock) is not called.
TEST(ProgressEngine, AHandlerRemovedAfterWaitEventsIsNotDispatched) {
  ProgressEngine engine;
  CountingHandler handler(1);
  engine.add_fd(handler.fd(), EPOLLIN, &handler);
  const int n = engine.wait_events(0);
  ASSERT_EQ(n, 1);
  std::jthread([&] { engine.remove_fd(handler.fd(), &handler); }).join();
  engine.dispatch_events(n);
  EXPECT_EQ(handler.calls, 0);
  // Added again (a new handler at the same address): dispatched as usual.
  engine.add_fd(handler.fd(), EPOLLIN, &handler);
  EXPECT_TRUE(engine.poll(0));
  EXPECT_EQ(handler.calls, 1);
}

// A handler removed, by name, by another handler of the same round is not called in it (so
// its owner may destroy it at once).
TEST(ProgressEngine, AHandlerRemovedByAnotherInTheSameRoundIsNotCalled) {
  ProgressEngine engine;
  struct Removing final : FdHandler {
    ProgressEngine* engine = nullptr;
    Fd fd{::eventfd(1, EFD_NONBLOCK)};
    int calls = 0;
    Removing* other = nullptr;
    void on_fd_events(std::uint32_t) override {
      std::uint64_t v;
      [[maybe_unused]] ssize_t n = ::read(fd.get(), &v, sizeof v);
      ++calls;
      engine->remove_fd(other->fd.get(), other);
    }
  } a, b;
  a.engine = b.engine = &engine;
  a.other = &b;
  b.other = &a;
  engine.add_fd(a.fd.get(), EPOLLIN, &a);
  engine.add_fd(b.fd.get(), EPOLLIN, &b);
  engine.wakeup();  // a third event in the round, dispatched as well
  EXPECT_TRUE(engine.poll(0));
  EXPECT_EQ(a.calls + b.calls, 1);
  EXPECT_FALSE(engine.poll(0));
}

// A signal that lands while connect_tcp waits for the handshake (a profiler's timer, a
// fuzzer's watchdog) used to end the wait with the socket still connecting, and connect_tcp
// returned it as connected. A listener whose accept queue is full drops the SYN, so the
// connect stays pending past the signal; it must then end with the deadline, not a socket.
TEST(Socket, ConnectInterruptedByASignalKeepsWaiting) {
  const ErrorContext ctx{.operation = "test.connect"};
  const Fd listener = listen_tcp(SockAddr::from_host_port("127.0.0.1", 0, ctx), 0, ctx);
  const SockAddr to = local_address(listener.get());
  // Fill the accept queue (backlog 0 holds one); nobody accepts.
  std::vector<Fd> queued;
  for (int i = 0; i < 2; ++i) queued.push_back(start_connect(to, nullptr, ctx));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));

  struct sigaction on_alarm {
  }, before{};
  on_alarm.sa_handler = [](int) {};
  ::sigemptyset(&on_alarm.sa_mask);
  ASSERT_EQ(::sigaction(SIGALRM, &on_alarm, &before), 0);  // no SA_RESTART
  itimerval once{};
  once.it_value.tv_usec = 100'000;
  ASSERT_EQ(::setitimer(ITIMER_REAL, &once, nullptr), 0);
  const auto start = Clock::now();
  const Error e = expect_error([&] {
    const Fd fd = connect_tcp(to, deadline_after(std::chrono::milliseconds(600)), ctx);
    sockaddr_storage peer{};
    socklen_t len = sizeof peer;
    ADD_FAILURE() << "connect_tcp returned a socket; getpeername: "
                  << (::getpeername(fd.get(), reinterpret_cast<sockaddr*>(&peer), &len) == 0
                          ? "connected"
                          : std::strerror(errno));
  });
  ::sigaction(SIGALRM, &before, nullptr);
  EXPECT_EQ(e.kind(), ErrorKind::timeout) << e.what();
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(550));
}

// Memory same-host peers map (Communicator::allocate_memory): a peer that can open it
// (/proc/PID/fd, pidfd_getfd) cannot shrink it under our mapping, where the next touch past the
// new end would kill this process with SIGBUS.
TEST(SharedSegment, APeerThatOpensItCannotShrinkIt) {
  constexpr std::size_t bytes = 1 << 16;
  SharedSegment segment("anview-test", bytes);
  const std::string path = "/proc/self/fd/" + std::to_string(segment.fd());
  Fd opened(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(opened.valid()) << errno_text(errno);
  ASSERT_NE(::ftruncate(opened.get(), 0), 0) << "a peer shrank the segment";
  EXPECT_EQ(errno, EPERM);
  segment.data()[bytes - 1] = 1;
  if (!anview::testing::pidfds_work()) return;  // map_from_process needs them
  std::string why;
  EXPECT_TRUE(map_from_process(static_cast<int>(::getpid()), segment.fd(), bytes, &why)) << why;
}

// Memory a peer offers whose size the peer could still shrink is not mapped.
TEST(SharedSegment, MemoryWhoseSizeIsNotSealedIsNotMapped) {
  if (!anview::testing::pidfds_work()) GTEST_SKIP() << "pidfd_open or pidfd_getfd is refused here";
  Fd unsealed(::memfd_create("anview-unsealed", MFD_CLOEXEC));
  ASSERT_TRUE(unsealed.valid()) << errno_text(errno);
  ASSERT_EQ(::ftruncate(unsealed.get(), 4096), 0);
  std::string why;
  EXPECT_FALSE(map_from_process(static_cast<int>(::getpid()), unsealed.get(), 4096, &why));
  EXPECT_NE(why.find("sealed against shrinking"), std::string::npos) << why;
}

// GLIBC_TUNABLES as glibc reads it: colon-separated name=value entries, the last one naming a
// tunable wins; a longer name that starts with it is another tunable.
TEST(GlibcTunables, TheLastEntryNamingTheTunableGivesItsValue) {
  const std::string_view name = malloc_huge_pages_tunable;
  EXPECT_EQ(glibc_tunable(nullptr, name), std::nullopt);
  EXPECT_EQ(glibc_tunable("", name), std::nullopt);
  EXPECT_EQ(glibc_tunable("glibc.malloc.hugetlb=1", name), "1");
  EXPECT_EQ(glibc_tunable("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2", name), "2");
  EXPECT_EQ(glibc_tunable("glibc.malloc.hugetlb=1:glibc.malloc.hugetlb=0", name), "0");
  EXPECT_EQ(glibc_tunable("glibc.malloc.hugetlb_x=1", name), std::nullopt);
  EXPECT_EQ(glibc_tunable("x.glibc.malloc.hugetlb=1", name), std::nullopt);
  EXPECT_EQ(glibc_tunable("::glibc.malloc.hugetlb=1:", name), "1");
  EXPECT_EQ(glibc_tunable("glibc.malloc.hugetlb", name), "");
}

}  // namespace
}  // namespace anview::base
