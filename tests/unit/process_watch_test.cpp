// ProcessWatch: a same-host peer's exit is seen through a pidfd, or through /proc where
// pidfd_open is refused.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sys/syscall.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "base/clock.hpp"
#include "base/process_watch.hpp"
#include "base/progress_engine.hpp"
#include "support/pidfds.hpp"

namespace {

using anview::base::ProcessWatch;
using anview::base::ProgressEngine;
using namespace std::chrono_literals;

// A child that sleeps until killed, named `name` (the comm field of /proc/PID/stat). A test
// that stops early kills and reaps it when the guard goes away; it also dies with this process.
struct SleepingChild {
  explicit SleepingChild(const char* name) : pid(::fork()) {
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
      ::prctl(PR_SET_NAME, name, 0, 0, 0);
      for (;;) ::pause();
    }
  }
  ~SleepingChild() {
    if (pid > 0 && !reaped) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  pid_t pid;
  bool reaped = false;
};

// Field 22 of /proc/PID/stat, read here independently of ProcessWatch.
std::uint64_t start_time_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream fields(text.substr(text.rfind(')') + 2));  // from field 3, the state
  std::string field;
  for (int i = 3; i <= 22; ++i) fields >> field;
  return std::stoull(field);
}

// Polls the engine until `done` or `limit` passed; true when done.
template <typename Done>
bool poll_until(ProgressEngine& engine, Done done, std::chrono::milliseconds limit) {
  const auto end = anview::base::Clock::now() + limit;
  while (!done() && anview::base::Clock::now() < end) engine.poll(20);
  return done();
}

void check_watch_sees_exit(bool polling, const char* name) {
  ProgressEngine engine;
  SleepingChild guard(name);
  const pid_t child = guard.pid;
  ASSERT_GT(child, 0);
  int exits = 0;
  std::string why;
  bool gone = false;
  auto watch = polling ? ProcessWatch::start_polling(
                             engine, child, [&] { ++exits; }, &why, &gone)
                       : ProcessWatch::start(
                             engine, child, [&] { ++exits; }, &why, &gone);
  ASSERT_NE(watch, nullptr) << why;
  EXPECT_FALSE(gone);
  EXPECT_EQ(watch->method(),
            polling ? ProcessWatch::Method::proc_poll : ProcessWatch::Method::pidfd);
  if (polling) {
    EXPECT_NE(watch->start_time(), 0u);
    EXPECT_EQ(watch->start_time(), start_time_of(child));
  }
  // Alive: several polling intervals pass without a report.
  EXPECT_FALSE(poll_until(
      engine, [&] { return exits > 0; }, 3 * ProcessWatch::poll_interval));
  EXPECT_FALSE(watch->exited());
  // Killed and not reaped (a zombie, as a peer is until its launcher waits for it): reported
  // within a few intervals, once.
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  EXPECT_TRUE(poll_until(
      engine, [&] { return exits > 0; }, 2s));
  EXPECT_TRUE(watch->exited());
  poll_until(
      engine, [] { return false; }, 2 * ProcessWatch::poll_interval);
  EXPECT_EQ(exits, 1);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  guard.reaped = true;
  EXPECT_TRUE(watch->exited());  // reaped: the file held open reads ESRCH
}

TEST(ProcessWatch, APidfdSeesAChildThatIsKilled) {
  if (!anview::testing::pidfds_work())
    GTEST_SKIP() << "pidfd_open is refused here (start() polls /proc)";
  check_watch_sees_exit(false, "watched");
}

// A name with spaces and parentheses: /proc/PID/stat's fields are found after the last ')'.
TEST(ProcessWatch, PollingProcSeesAChildThatIsKilled) {
  check_watch_sees_exit(true, "a) b (c) d");
}

TEST(ProcessWatch, AProcessThatHasExitedIsGoneAtTheStart) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // reaped: its pid names no process now
  ProgressEngine engine;
  for (bool polling : {false, true}) {
    std::string why;
    bool gone = false;
    auto watch = polling ? ProcessWatch::start_polling(
                               engine, child, [] {}, &why, &gone)
                         : ProcessWatch::start(
                               engine, child, [] {}, &why, &gone);
    EXPECT_EQ(watch, nullptr);
    EXPECT_TRUE(gone) << why;
  }
}

// A watch whose fd turned ready in the same round as another's, destroyed by that other's
// handler, is not called (the engine drops its events still to come in the round).
TEST(ProcessWatch, AWatchDestroyedByAnotherInTheSameRoundIsNotCalled) {
  SleepingChild a("a"), b("b");
  ProgressEngine engine;
  std::unique_ptr<ProcessWatch> watches[2];
  int calls = 0;
  for (int i = 0; i < 2; ++i) {
    std::string why;
    watches[i] = ProcessWatch::start_polling(
        engine, i == 0 ? a.pid : b.pid,
        [&, i] {
          ++calls;
          watches[1 - i].reset();  // the other one's timer fired in this round too
        },
        &why);
    ASSERT_NE(watches[i], nullptr) << why;
  }
  ASSERT_EQ(::kill(a.pid, SIGKILL), 0);
  ASSERT_EQ(::kill(b.pid, SIGKILL), 0);
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(a.pid), &info, WEXITED | WNOWAIT), 0);
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(b.pid), &info, WEXITED | WNOWAIT), 0);
  // Both timers expire before the round that reads them.
  std::this_thread::sleep_for(2 * ProcessWatch::poll_interval);
  engine.poll(0);
  EXPECT_EQ(calls, 1);
}

TEST(ProcessWatch, AZombieIsGoneAtTheStartOfPolling) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  // Not reaped: a zombie until waitpid below. Wait for the exit itself without reaping it.
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT), 0);
  ProgressEngine engine;
  std::string why;
  bool gone = false;
  EXPECT_EQ(ProcessWatch::start_polling(
                engine, child, [] {}, &why, &gone),
            nullptr);
  EXPECT_TRUE(gone) << why;
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
}

}  // namespace
