// Runs the built anview-run (ANVIEW_RUN_PATH) on small /bin/sh jobs and checks what it does:
// the ranks' environment, output forwarding, exit codes, and how it stops a job.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// anview-run started with its stdout and stderr on pipes that the test reads.
class Launcher {
 public:
  struct Result {
    int exit_code = -1;  // -signal when anview-run itself was killed by one
    std::string out;
    std::string err;
    double seconds = 0;  // from start to exit
  };

  enum class Stdout { pipe, terminal };  // a pseudo-terminal the test reads from its master

  explicit Launcher(const std::vector<std::string>& args,
                    const std::map<std::string, std::string>& env = {},
                    Stdout kind = Stdout::pipe) {
    int out[2];
    int err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) std::abort();
    if (kind == Stdout::terminal) {
      ::close(out[0]);
      ::close(out[1]);
      out[0] = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
      if (out[0] < 0 || ::grantpt(out[0]) != 0 || ::unlockpt(out[0]) != 0) std::abort();
      out[1] = ::open(::ptsname(out[0]), O_RDWR | O_NOCTTY | O_CLOEXEC);
      if (out[1] < 0) std::abort();
    }
    start_ = Clock::now();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
      std::vector<char*> argv{const_cast<char*>(ANVIEW_RUN_PATH)};
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(ANVIEW_RUN_PATH, argv.data());
      ::_exit(99);
    }
    ::close(out[1]);
    ::close(err[1]);
    fds_[0] = out[0];
    fds_[1] = err[0];
    for (const int fd : fds_) ::fcntl(fd, F_SETFL, O_NONBLOCK);
  }
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;
  ~Launcher() {
    if (!exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    for (const int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
  }

  pid_t pid() const { return pid_; }

  // Off: the test reads anview-run's stdout no more (a reader that stalled); stderr still.
  void read_stdout(bool on) { read_stdout_ = on; }

  // Reads until stderr contains `text`; false if that takes longer than `limit`.
  bool wait_for_stderr(const std::string& text,
                       std::chrono::seconds limit = std::chrono::seconds(10)) {
    const auto deadline = Clock::now() + limit;
    while (result_.err.find(text) == std::string::npos) {
      if (Clock::now() > deadline || fds_[1] < 0) return false;
      pump(50);
    }
    return true;
  }

  // Reads until stdout holds `count` lines; false if that takes longer than `limit`.
  bool wait_for_stdout_lines(std::size_t count,
                             std::chrono::seconds limit = std::chrono::seconds(10)) {
    const auto deadline = Clock::now() + limit;
    while (lines_of(result_.out).size() < count) {
      if (Clock::now() > deadline || (fds_[0] < 0 && fds_[1] < 0)) return false;
      pump(50);
    }
    return true;
  }

  // Reads all output and waits for anview-run to exit (kills it after `limit`). Output that
  // leftover processes might write after the exit is not waited for beyond a moment.
  Result finish(std::chrono::seconds limit = std::chrono::seconds(20)) {
    const auto deadline = Clock::now() + limit;
    Clock::time_point exited_at{};
    while (true) {
      pump(20);
      if (!exited_) {
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG) == pid_) {
          exited_ = true;
          exited_at = Clock::now();
          result_.seconds = seconds_since(start_);
          result_.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
        } else if (Clock::now() > deadline) {
          ADD_FAILURE() << "anview-run did not exit within " << limit.count() << " s";
          ::kill(pid_, SIGKILL);
        }
      }
      const bool drained = fds_[0] < 0 && fds_[1] < 0;
      if (exited_ && (drained || Clock::now() - exited_at > std::chrono::seconds(1))) break;
    }
    return result_;
  }

 private:
  void pump(int timeout_ms) {
    std::vector<pollfd> polled;
    for (int i = 0; i < 2; ++i) {
      if (fds_[i] >= 0 && (i == 1 || read_stdout_))
        polled.push_back({.fd = fds_[i], .events = POLLIN, .revents = 0});
    }
    if (polled.empty()) {
      ::usleep(static_cast<useconds_t>(timeout_ms) * 1000);
      return;
    }
    ::poll(polled.data(), polled.size(), timeout_ms);
    for (int i = 0; i < 2; ++i) {
      if (fds_[i] < 0 || (i == 0 && !read_stdout_)) continue;
      std::string& sink = i == 0 ? result_.out : result_.err;
      char buffer[65536];
      ssize_t n;
      while ((n = ::read(fds_[i], buffer, sizeof(buffer))) > 0)
        sink.append(buffer, static_cast<std::size_t>(n));
      if (n == 0) {
        ::close(fds_[i]);
        fds_[i] = -1;
      }
    }
  }

  pid_t pid_ = -1;
  int fds_[2] = {-1, -1};
  bool exited_ = false;
  bool read_stdout_ = true;
  Clock::time_point start_;
  Result result_;
};

Launcher::Result run(const std::vector<std::string>& args,
                     const std::map<std::string, std::string>& env = {}) {
  Launcher launcher(args, env);
  return launcher.finish();
}

bool process_gone(pid_t pid) {
  return ::kill(pid, 0) != 0 && errno == ESRCH;
}

TEST(Launcher, EveryRankGetsItsOwnEnvironment) {
  // A stale ANVIEW_RANK in the launcher's environment must not leak into the ranks.
  const std::string script =
      "echo \"$ANVIEW_RANK $ANVIEW_WORLD_SIZE $ANVIEW_LOCAL_RANK $ANVIEW_LOCAL_WORLD_SIZE "
      "$ANVIEW_ROOT\"";
  const auto r = run({"-n", "4", "/bin/sh", "-c", script}, {{"ANVIEW_RANK", "77"}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 4u) << r.out;
  std::set<int> ranks;
  std::set<std::string> roots;
  const std::regex pattern(R"((\d+) 4 (\d+) 4 (127\.0\.0\.1:(\d+)))");
  for (const std::string& line : lines) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, pattern)) << line;
    EXPECT_EQ(m[1], m[2]) << "local rank differs from rank on one host: " << line;
    ranks.insert(std::stoi(m[1]));
    roots.insert(m[3]);
    const int port = std::stoi(m[4]);
    EXPECT_GT(port, 0);
    EXPECT_LT(port, 65536);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(roots.size(), 1u) << "all ranks must share one root";
}

TEST(Launcher, EmulatedHostsSplitTheRanksIntoConsecutiveGroups) {
  const auto r =
      run({"-n", "5", "--emulate-hosts", "2", "/bin/sh", "-c",
           "echo $ANVIEW_RANK $ANVIEW_HOST_ID $ANVIEW_LOCAL_RANK/$ANVIEW_LOCAL_WORLD_SIZE"},
          {{"ANVIEW_HOST_ID", "stale"}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = lines_of(r.out);
  EXPECT_EQ(std::set<std::string>(lines.begin(), lines.end()),
            (std::set<std::string>{"0 emulated-host-0 0/3", "1 emulated-host-0 1/3",
                                   "2 emulated-host-0 2/3", "3 emulated-host-1 0/2",
                                   "4 emulated-host-1 1/2"}));
}

// The ranks' malloc asks for huge pages (GLIBC_TUNABLES); what the user set is kept.
TEST(Launcher, RanksGetMallocHugePagesUnlessTheUserChoseOtherwise) {
  const std::vector<std::string> echo = {"/bin/sh", "-c", "echo \"[$GLIBC_TUNABLES]\""};
  auto tunables_of = [&](std::vector<std::string> args, const std::string& inherited) {
    args.insert(args.end(), echo.begin(), echo.end());
    const auto r = run(args, {{"GLIBC_TUNABLES", inherited}});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const auto lines = lines_of(r.out);
    return std::set<std::string>(lines.begin(), lines.end());
  };
  using Lines = std::set<std::string>;
  EXPECT_EQ(tunables_of({"-n", "2"}, ""), Lines{"[glibc.malloc.hugetlb=1]"});
  EXPECT_EQ(tunables_of({"-n", "2"}, "glibc.malloc.arena_max=2"),
            Lines{"[glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1]"});
  EXPECT_EQ(tunables_of({"-n", "1"}, "glibc.malloc.hugetlb=0"), Lines{"[glibc.malloc.hugetlb=0]"});
  EXPECT_EQ(tunables_of({"-n", "1"}, "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2"),
            Lines{"[glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2]"});
  EXPECT_EQ(tunables_of({"-n", "1"}, "glibc.malloc.hugetlb_x=1"),
            Lines{"[glibc.malloc.hugetlb_x=1:glibc.malloc.hugetlb=1]"});
  EXPECT_EQ(tunables_of({"-n", "1", "--no-huge-pages"}, ""), Lines{"[]"});
  EXPECT_EQ(tunables_of({"-n", "1", "--no-huge-pages"}, "glibc.malloc.arena_max=2"),
            Lines{"[glibc.malloc.arena_max=2]"});
}

// And glibc honours it: a 16 MiB malloc block of a rank is advised MADV_HUGEPAGE ("hg" in its
// VmFlags), where glibc has the tunable (2.35+) and the kernel's policy is madvise (under
// "always" glibc leaves it to the kernel, under "never" there is nothing to ask for).
TEST(Launcher, ARanksLargeMallocBlocksAreAdvisedForHugePages) {
  std::ifstream policy_file("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string policy;
  std::getline(policy_file, policy);
  if (policy.find("[madvise]") == std::string::npos)
    GTEST_SKIP() << "transparent huge pages here: " << policy;
  if (::access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/python3";
  // The rank mallocs 16 MiB and prints the VmFlags of the mapping that holds it.
  const std::string program = R"(
import ctypes
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.gnu_get_libc_version.restype = ctypes.c_char_p
version = tuple(int(x) for x in libc.gnu_get_libc_version().decode().split(".")[:2])
p = libc.malloc(16 << 20)
ctypes.memset(p, 1, 16 << 20)
inside = False
flags = "none"
for line in open("/proc/self/smaps"):
    if "-" in line.split()[0] and not line.startswith("VmFlags"):
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        inside = lo <= p < hi
    elif inside and line.startswith("VmFlags:"):
        flags = line.split(":", 1)[1].split()
print("old-glibc" if version < (2, 35) else ("hg" if "hg" in flags else "no-hg"))
)";
  for (const bool huge : {true, false}) {
    std::vector<std::string> args = {"-n", "1"};
    if (!huge) args.push_back("--no-huge-pages");
    args.insert(args.end(), {"/usr/bin/python3", "-c", program});
    const auto r = run(args, {{"GLIBC_TUNABLES", ""}});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    if (r.out == "old-glibc\n") GTEST_SKIP() << "glibc before 2.35 has no glibc.malloc.hugetlb";
    EXPECT_EQ(r.out, huge ? "hg\n" : "no-hg\n") << (huge ? "default" : "--no-huge-pages");
  }
}

TEST(Launcher, NpIsAnAliasOfN) {
  const auto r = run({"-np", "2", "/bin/sh", "-c", "echo $ANVIEW_RANK/$ANVIEW_WORLD_SIZE"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = lines_of(r.out);
  EXPECT_EQ(std::set<std::string>(lines.begin(), lines.end()),
            (std::set<std::string>{"0/2", "1/2"}));
}

TEST(Launcher, ArgumentsAfterProgramAreNotParsed) {
  const auto r = run({"-n", "1", "--", "/bin/sh", "-c", "printf '%s|' \"$@\"", "sh", "-n", "5",
                      "--timeout", "x", "-np"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "-n|5|--timeout|x|-np|");
}

TEST(Launcher, PassesOutputThroughWithoutTagOutput) {
  const auto r =
      run({"-n", "2", "/bin/sh", "-c", "echo out$ANVIEW_RANK; echo err$ANVIEW_RANK >&2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = lines_of(r.out);
  const auto err = lines_of(r.err);
  EXPECT_EQ(std::set<std::string>(out.begin(), out.end()), (std::set<std::string>{"out0", "out1"}));
  EXPECT_EQ(std::set<std::string>(err.begin(), err.end()), (std::set<std::string>{"err0", "err1"}));
}

TEST(Launcher, TagOutputPrefixesWholeLinesOnTheirOwnStream) {
  // 300 lines of ~500 bytes per rank: more than a pipe holds, so lines cross read boundaries
  // while three ranks write at once. The last line has no newline.
  const std::string script =
      "x=$(printf '%0500d' 0); i=0; "
      "while [ $i -lt 300 ]; do echo \"$ANVIEW_RANK-$i-$x\"; i=$((i+1)); done; "
      "echo \"error from $ANVIEW_RANK\" >&2; printf \"last of $ANVIEW_RANK\"";
  const auto r = run({"-n", "3", "--tag-output", "/bin/sh", "-c", script});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_FALSE(r.out.empty());
  EXPECT_EQ(r.out.back(), '\n') << "the unterminated last line is flushed with a newline";

  const std::regex numbered(R"(\[(\d)\] (\d)-(\d+)-0{500})");
  std::map<int, int> next_index;
  std::set<std::string> last_lines;
  for (const std::string& line : lines_of(r.out)) {
    std::smatch m;
    if (std::regex_match(line, m, numbered)) {
      EXPECT_EQ(m[1], m[2]) << "line of rank " << m[2] << " tagged as " << m[1];
      const int rank = std::stoi(m[2]);
      EXPECT_EQ(std::stoi(m[3]), next_index[rank]++) << "lines of rank " << rank << " out of order";
    } else {
      last_lines.insert(line);
    }
  }
  EXPECT_EQ(next_index, (std::map<int, int>{{0, 300}, {1, 300}, {2, 300}}));
  EXPECT_EQ(last_lines, (std::set<std::string>{"[0] last of 0", "[1] last of 1", "[2] last of 2"}));

  const auto err = lines_of(r.err);
  EXPECT_EQ(std::set<std::string>(err.begin(), err.end()),
            (std::set<std::string>{"[0] error from 0", "[1] error from 1", "[2] error from 2"}));
}

// Every stdout line is "[rank] y" (the output of `yes`): whole lines, none cut or mixed.
void expect_whole_yes_lines(const std::string& out) {
  std::size_t lines = 0;
  for (const std::string& line : lines_of(out)) {
    ++lines;
    if (line != "[0] y" && line != "[1] y") {
      ADD_FAILURE() << "line " << lines << " is '" << line.substr(0, 80) << "'";
      return;
    }
  }
}

// Under --tag-output the launcher writes the ranks' lines itself. A reader that stops reading
// (a paused pager, a stalled ssh session) used to block it in write(): --timeout, signals and
// ranks' deaths went unseen until the reader went on. Now the output waits and the job does
// not: the timeout stops the ranks while the reader still reads nothing.
TEST(Launcher, AStalledReaderOfTagOutputDoesNotStopTheTimeout) {
  Launcher launcher({"-n", "2", "--tag-output", "--timeout", "2", "/bin/sh", "-c",
                     "yes | head -c 20000000; sleep 30"});
  launcher.read_stdout(false);
  ASSERT_TRUE(launcher.wait_for_stderr("job ran past --timeout 2 s; ranks 0-1 still running"));
  launcher.read_stdout(true);  // the reader goes on: what was queued comes out, whole
  const auto r = launcher.finish();
  EXPECT_EQ(r.exit_code, 124) << r.err;
  EXPECT_GT(r.out.size(), 1000000u);
  expect_whole_yes_lines(r.out);
}

TEST(Launcher, AStalledReaderOfTagOutputDoesNotStopCtrlC) {
  Launcher launcher(
      {"-n", "2", "--tag-output", "/bin/sh", "-c", "yes | head -c 20000000; sleep 30"});
  launcher.read_stdout(false);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the pipes fill up
  ASSERT_EQ(::kill(launcher.pid(), SIGINT), 0);
  ASSERT_TRUE(launcher.wait_for_stderr("received SIGINT; sending it to ranks 0-1",
                                       std::chrono::seconds(5)));
  launcher.read_stdout(true);
  const auto r = launcher.finish();
  EXPECT_EQ(r.exit_code, 130) << r.err;
  expect_whole_yes_lines(r.out);
}

// The same on a terminal that is not read (a stalled ssh session): a terminal says writable
// with little room, so a launcher that wrote a few KiB on its blocking descriptor after
// poll() still sat in write().
TEST(Launcher, AStalledTerminalDoesNotStopTheTimeout) {
  Launcher launcher({"-n", "2", "--tag-output", "--timeout", "2", "/bin/sh", "-c",
                     "yes | head -c 20000000; sleep 30"},
                    {}, Launcher::Stdout::terminal);
  launcher.read_stdout(false);
  ASSERT_TRUE(launcher.wait_for_stderr("job ran past --timeout 2 s; ranks 0-1 still running"));
  // Stopped: the output waits for its reader no longer than the ranks were given (2 s).
  ASSERT_TRUE(launcher.wait_for_stderr("bytes of output waited for their reader; dropping them"));
  const auto r = launcher.finish();
  EXPECT_EQ(r.exit_code, 124) << r.err;
}

// Once the ranks are done, the launcher waits for its reader to take the output (here 1.8 MB
// of tagged lines, less than OutputSink::high_water); a signal
// then drops it, and says so, instead of leaving the launcher stuck.
TEST(Launcher, AStopSignalDropsOutputThatWaitsForAStalledReader) {
  Launcher launcher(
      {"-n", "2", "--tag-output", "/bin/sh", "-c", "yes | head -c 300000; echo done >&2"});
  launcher.read_stdout(false);
  ASSERT_TRUE(launcher.wait_for_stderr("[0] done"));
  ASSERT_TRUE(launcher.wait_for_stderr("[1] done"));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the ranks exit
  const auto signalled = Clock::now();
  ASSERT_EQ(::kill(launcher.pid(), SIGTERM), 0);
  const auto r = launcher.finish(std::chrono::seconds(5));
  EXPECT_EQ(r.exit_code, 143) << r.err;
  EXPECT_LT(seconds_since(signalled), 3.0);
  EXPECT_NE(r.err.find("received SIGTERM while"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("bytes of output waited for their reader; dropping them"), std::string::npos)
      << r.err;
}

// Ranks that ended by themselves leave their output to a reader that does not read: the
// launcher waits for it as cat would, but not past the job's --timeout (it waited without end).
TEST(Launcher, TheTimeoutHoldsWhileOutputWaitsForAStalledReader) {
  Launcher launcher({"-n", "2", "--timeout", "2", "--tag-output", "/bin/sh", "-c",
                     "yes | head -c 300000; echo done >&2"});
  launcher.read_stdout(false);
  ASSERT_TRUE(launcher.wait_for_stderr("[0] done"));
  ASSERT_TRUE(launcher.wait_for_stderr("[1] done"));
  const auto r = launcher.finish(std::chrono::seconds(8));
  EXPECT_EQ(r.exit_code, 124) << r.err;
  EXPECT_LT(r.seconds, 5.0);
  EXPECT_NE(r.err.find("the job ran past --timeout 2 s while"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("bytes of output waited for their reader; dropping them"), std::string::npos)
      << r.err;
}

TEST(Launcher, ExitCodeIsTheFailingRanks) {
  const auto r = run({"-n", "3", "/bin/sh", "-c", "[ \"$ANVIEW_RANK\" = 1 ] && exit 3; exit 0"});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.err.find("anview-run: rank 1 (pid "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with code 3"), std::string::npos) << r.err;
}

TEST(Launcher, KilledRankStopsTheOthersAfterTheGracePeriod) {
  const auto r = run({"-n", "3", "--grace", "1", "/bin/sh", "-c",
                      "[ \"$ANVIEW_RANK\" = 2 ] && kill -KILL $$; sleep 30"});
  EXPECT_EQ(r.exit_code, 128 + SIGKILL);
  EXPECT_NE(r.err.find("rank 2 (pid "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("was killed by signal 9 (SIGKILL)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ranks 0-1 still running 1 s after rank 2 failed; sending SIGTERM"),
            std::string::npos)
      << r.err;
  EXPECT_GE(r.seconds, 0.9) << "the others were not given their grace period";
  EXPECT_LT(r.seconds, 6.0);
}

TEST(Launcher, RanksFailingOnTheirOwnDuringTheGracePeriodAreReported) {
  const auto r = run({"-n", "2", "--grace", "5", "/bin/sh", "-c",
                      "[ \"$ANVIEW_RANK\" = 0 ] && exit 4; sleep 0.3; exit 5"});
  EXPECT_EQ(r.exit_code, 4) << "the first failure decides the exit code";
  EXPECT_NE(r.err.find("rank 0 (pid "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 1 (pid "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with code 5"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("waiting up to 5 s for rank 1 to exit before sending SIGTERM"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("; sending SIGTERM"), std::string::npos)
      << "nobody needed stopping: " << r.err;
  EXPECT_LT(r.seconds, 3.0);
}

TEST(Launcher, RankIgnoringSigtermGetsSigkill) {
  // sleep inherits the ignored SIGTERM, so only SIGKILL (2 s after SIGTERM) ends rank 1.
  const auto r = run({"-n", "2", "--grace", "0.5", "/bin/sh", "-c",
                      "[ \"$ANVIEW_RANK\" = 0 ] && exit 1; trap '' TERM; sleep 30"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("sending SIGTERM"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 1 still alive 2 s after SIGTERM; sending SIGKILL"), std::string::npos)
      << r.err;
  EXPECT_GE(r.seconds, 2.4);
  EXPECT_LT(r.seconds, 5.0);
}

TEST(Launcher, TimeoutStopsTheJobWith124) {
  const auto r = run({"-n", "2", "--timeout", "1", "/bin/sh", "-c", "sleep 30"});
  EXPECT_EQ(r.exit_code, 124);
  EXPECT_NE(r.err.find("--timeout 1 s; ranks 0-1 still running"), std::string::npos) << r.err;
  EXPECT_GE(r.seconds, 0.9);
  EXPECT_LT(r.seconds, 4.0);
}

TEST(Launcher, ProgramNotFoundExits127) {
  const auto r = run({"-n", "2", "anview-no-such-program", "arg"});
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_NE(r.err.find("cannot execute 'anview-no-such-program'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("No such file or directory"), std::string::npos) << r.err;
}

TEST(Launcher, BadCommandLinesAreUsageErrors) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"-n", "0", "true"},
           {"-n", "-1", "true"},
           {"true"},                        // no -n
           {"-n", "2"},                     // no PROGRAM
           {"-n", "2", "--bogus", "true"},  // unknown option
           {"-n", "2", "--timeout", "soon", "true"},
           {"-n", "2", "--emulate-hosts", "3", "true"},  // more hosts than ranks
           {"-n", "2", "--emulate-hosts", "-1", "true"},
       }) {
    const auto r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args[0] << " ... " << args.back() << ": " << r.err;
    EXPECT_FALSE(r.err.empty());
  }
}

// Starts `ranks` ranks, each a shell that prints its pid and that of a background child, sends
// anview-run `sig`, and checks the exit code, what it said, and that every shell and child
// is gone within 5 s.
void stop_with_signal(int sig, int ranks, int exit_code, const std::string& said) {
  Launcher launcher(
      {"-n", std::to_string(ranks), "/bin/sh", "-c", "sleep 30 & echo \"$$ $!\"; wait"});
  ASSERT_TRUE(launcher.wait_for_stdout_lines(static_cast<std::size_t>(ranks)));
  const auto signalled = Clock::now();
  ASSERT_EQ(::kill(launcher.pid(), sig), 0);
  const auto r = launcher.finish();
  EXPECT_EQ(r.exit_code, exit_code) << r.err;
  EXPECT_LT(seconds_since(signalled), 5.0);
  EXPECT_NE(r.err.find(said), std::string::npos) << r.err;
  std::vector<pid_t> pids;
  for (const std::string& line : lines_of(r.out)) {
    std::istringstream in(line);
    pid_t shell = 0;
    pid_t child = 0;
    ASSERT_TRUE(in >> shell >> child) << line;
    pids.push_back(shell);
    pids.push_back(child);
  }
  ASSERT_EQ(pids.size(), 2 * static_cast<std::size_t>(ranks));
  for (const pid_t pid : pids) EXPECT_TRUE(process_gone(pid)) << "pid " << pid << " survived";
}

// The background child ignores SIGINT (as background jobs of sh do), so it takes the process
// group and SIGKILL to stop it.
TEST(Launcher, SigintStopsEveryRankAndTheirChildren) {
  stop_with_signal(SIGINT, 3, 130, "received SIGINT; sending it to ranks 0-2");
}

// A hangup (the ssh session of anview-run dropped) stops the job as SIGTERM does: the ranks
// get SIGTERM, and their children go too. Before, SIGHUP killed the launcher alone; its
// ranks got SIGKILL (PR_SET_PDEATHSIG) and their children lived on.
TEST(Launcher, SighupSendsTheRanksSigtermAndStopsTheJobWith129) {
  stop_with_signal(SIGHUP, 2, 129, "received SIGHUP; sending SIGTERM to ranks 0-1");
}

// Processes a rank leaves behind in its process group when it exits (a background job, a
// data loader) are stopped with the job: anview-run does not exit while they run on. Before,
// it exited at once and they lived on under init.
TEST(Launcher, ProcessesLeftInTheRanksGroupsAreStoppedWithTheJob) {
  Launcher launcher({"-n", "2", "/bin/sh", "-c", "sleep 300 & echo $!"});
  const auto r = launcher.finish();
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("every rank has exited; processes left in the process groups of ranks 0-1 "
                       "still run; sending SIGTERM"),
            std::string::npos)
      << r.err;
  const auto pids = lines_of(r.out);
  ASSERT_EQ(pids.size(), 2u) << r.out;
  for (const std::string& pid : pids)
    EXPECT_TRUE(process_gone(std::stoi(pid))) << pid << " survived";
}

// Ctrl-\ (SIGQUIT) stops the job as Ctrl-C does. Before, it killed the launcher alone.
TEST(Launcher, SigquitStopsEveryRankAndTheirChildren) {
  stop_with_signal(SIGQUIT, 2, 131, "received SIGQUIT; sending it to ranks 0-1");
}

// SIGUSR1 and SIGUSR2 reach every rank (an Anview rank dumps its flight recorder on SIGUSR1),
// and the job goes on. Before, either killed the launcher, and its ranks with SIGKILL.
TEST(Launcher, SigusrIsPassedToTheRanksWhichGoOn) {
  // Each rank ends by itself once it saw both (the group's `sleep` dies of them, harmlessly).
  Launcher launcher({"-n", "2", "/bin/sh", "-c",
                     "got1=0; got2=0; trap 'got1=1; echo usr1 $ANVIEW_RANK' USR1; "
                     "trap 'got2=1; echo usr2 $ANVIEW_RANK' USR2; echo ready; i=0; "
                     "while [ $got1 -eq 0 ] || [ $got2 -eq 0 ]; do sleep 0.05; i=$((i+1)); "
                     "[ $i -gt 400 ] && exit 3; done; exit 0"});
  ASSERT_TRUE(launcher.wait_for_stdout_lines(2));
  ASSERT_EQ(::kill(launcher.pid(), SIGUSR1), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(::kill(launcher.pid(), SIGUSR2), 0);
  const auto r = launcher.finish();
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const char* line : {"usr1 0", "usr1 1", "usr2 0", "usr2 1"})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << " missing from\n" << r.out;
  EXPECT_NE(r.err.find("received SIGUSR1; passing it to ranks 0-1"), std::string::npos) << r.err;
}

TEST(Launcher, SigtermStopsTheJobWith143) {
  Launcher launcher({"-n", "2", "/bin/sh", "-c", "echo ready; sleep 30"});
  ASSERT_TRUE(launcher.wait_for_stdout_lines(2));
  ASSERT_EQ(::kill(launcher.pid(), SIGTERM), 0);
  const auto r = launcher.finish();
  EXPECT_EQ(r.exit_code, 143) << r.err;
  EXPECT_LT(r.seconds, 5.0);
}

}  // namespace
