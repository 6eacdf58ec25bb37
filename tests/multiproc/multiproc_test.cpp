// Process-per-rank fault tests that anview-run's exit code alone cannot judge.
//
// The kill scenario ends with anview-run exiting non-zero (one of its ranks was SIGKILLed on
// purpose), so success is read elsewhere: each survivor writes DIR/rank<R>.result ("OK ..." or
// "FAIL ..."), and the launcher's own report must name the killed rank and its signal.
// Binaries: ANVIEW_RUN_PATH and ANVIEW_P2P_CHECK_PATH (compile definitions).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// A fresh directory, removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "anview-mp-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) std::abort();
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

struct RunResult {
  int exit_code = -1;  // -signal when anview-run itself died of one, -1000 when we killed it
  std::string out;
  std::string err;
  double seconds = 0;
};

// Runs `args` (args[0] is the program) with stdout and stderr in files under `dir` and
// `env` ("NAME=value") added to the environment; kills it after `limit`.
RunResult run(const std::vector<std::string>& args, const std::vector<std::string>& env,
              const fs::path& dir, std::chrono::seconds limit) {
  const std::string out_path = (dir / "stdout.txt").string();
  const std::string err_path = (dir / "stderr.txt").string();
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    bool overridden = false;
    for (const auto& o : env) overridden |= o.rfind(name + "=", 0) == 0;
    if (!overridden) envp.push_back(*e);
  }
  envp.push_back(nullptr);
  RunResult result;
  const auto start = Clock::now();
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    result.err = "posix_spawn(" + args[0] + "): " + std::strerror(rc);
    return result;
  }
  int status = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (Clock::now() - start > limit) {
      ::kill(pid, SIGTERM);  // anview-run stops its ranks on SIGTERM
      ::waitpid(pid, &status, 0);
      status = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (status == -1) {
    result.exit_code = -1000;
  } else if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.exit_code = -WTERMSIG(status);
  }
  result.out = read_file(out_path);
  result.err = read_file(err_path);
  return result;
}

// Names in /dev/shm: shared-memory segments must never be left behind, even by a rank that
// was killed (Anview's are unnamed memfds).
std::vector<std::string> dev_shm_entries() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/dev/shm", ec))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// anview-run -n N anview_p2p_check kill: rank N-1 SIGKILLs itself after a barrier; ranks
// 0 .. N-2 must each see peer_lost for it within 3 s, fail later operations with it fast and
// still exchange messages among themselves (anview_p2p_check checks that and writes a result
// file per survivor). `env` is added to the ranks' environment, `extra` to anview_p2p_check's
// arguments.
void kill_one_rank(int n, const std::vector<std::string>& env = {},
                   const std::vector<std::string>& extra = {},
                   const std::string& scenario = "kill") {
  TempDir dir;
  const int victim = n - 1;
  const auto shm_before = dev_shm_entries();
  // --grace 10: survivors must end on their own, well inside it (checked below: no SIGTERM).
  std::vector<std::string> args = {
      ANVIEW_RUN_PATH,       "-n",     std::to_string(n), "--timeout",        "60", "--grace", "10",
      ANVIEW_P2P_CHECK_PATH, scenario, "--result-dir",    dir.path().string()};
  args.insert(args.end(), extra.begin(), extra.end());
  const RunResult r = run(args, env, dir.path(), std::chrono::seconds(80));
  const std::string context = "anview-run exit code " + std::to_string(r.exit_code) + " after " +
                              std::to_string(r.seconds) + " s\n--- stdout ---\n" + r.out +
                              "--- stderr ---\n" + r.err;
  SCOPED_TRACE(context);

  // The first (and only) failing rank is the killed one: 128 + SIGKILL.
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.exit_code, 128 + SIGKILL);
  // The launcher's report names the rank and the signal on one line.
  bool named = false;
  std::istringstream lines(r.err);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("anview-run: ", 0) == 0 &&
        line.find("rank " + std::to_string(victim) + " ") != std::string::npos &&
        line.find("SIGKILL") != std::string::npos)
      named = true;
  }
  EXPECT_TRUE(named) << "no anview-run line names rank " << victim << " and SIGKILL";
  // The survivors ended on their own and with 0: the launcher never had to stop them ("...;
  // sending SIGTERM" is how it reports doing so) and reports no other rank.
  EXPECT_EQ(r.err.find("; sending SIGTERM"), std::string::npos);
  for (int rank = 0; rank < victim; ++rank) {
    EXPECT_EQ(r.err.find("anview-run: rank " + std::to_string(rank) + " (pid"), std::string::npos)
        << "survivor rank " << rank << " did not exit with 0";
  }

  for (int rank = 0; rank < victim; ++rank) {
    const fs::path file = dir.path() / ("rank" + std::to_string(rank) + ".result");
    ASSERT_TRUE(fs::exists(file)) << "survivor rank " << rank << " wrote no result";
    const std::string text = read_file(file);
    EXPECT_EQ(text.rfind("OK ", 0), 0u) << "rank " << rank << ": " << text;
  }
  EXPECT_FALSE(fs::exists(dir.path() / ("rank" + std::to_string(victim) + ".result")))
      << "the killed rank wrote a result";
  EXPECT_NE(r.out.find("anview_p2p_check " + scenario + ": OK"), std::string::npos);
  EXPECT_EQ(dev_shm_entries(), shm_before) << "entries appeared in /dev/shm";
}

const std::vector<std::string> tcp_only = {"ANVIEW_TRANSPORTS=tcp"};

TEST(MultiprocKill, TwoRanks) {
  kill_one_rank(2);
}
TEST(MultiprocKill, FourRanks) {
  kill_one_rank(4);
}
TEST(MultiprocKill, TcpTwoRanks) {
  kill_one_rank(2, tcp_only);
}
TEST(MultiprocKill, TcpFourRanks) {
  kill_one_rank(4, tcp_only);
}
// Over shm with cross-memory attach denied: large messages are in the ring in fragments.
TEST(MultiprocKill, NoCmaTwoRanks) {
  kill_one_rank(2, {}, {"--deny-cma"});
}
// With pidfd_open refused (kernels before 5.3, older container seccomp profiles) the survivors
// watch the victim through /proc: over shm, where no end of stream would tell them, and over
// TCP with its only stream paused, where the dead peer's kernel still holds data for it.
TEST(MultiprocKill, NoPidfdFourRanks) {
  kill_one_rank(4, {}, {"--deny-pidfd"});
}
TEST(MultiprocKill, DuringAllreduceFourRanksNoPidfd) {
  kill_one_rank(4, {}, {"--deny-pidfd"}, "coll_kill");
}
TEST(MultiprocKill, TcpNoPidfdWhileTheOnlyStreamIsPaused) {
  kill_one_rank(2,
                {"ANVIEW_TRANSPORTS=tcp", "ANVIEW_TCP_STREAMS=1", "ANVIEW_UNEXPECTED_BYTES=64K",
                 "ANVIEW_TIMEOUT=5"},
                {"--preload", "1048576", "--deny-pidfd"});
}
// Two emulated hosts: the victim is reached over shm by one survivor, over tcp by the others.
TEST(MultiprocKill, MixedFourRanks) {
  kill_one_rank(4, {}, {"--hosts", "2"});
}

// A rank dies in the middle of a loop of allreduces: every survivor fails with peer_lost naming
// it within seconds, also those that were waiting for a live neighbour (the ring).
// Over shm the 1 MiB allreduce is the tuner's pick, and each same-host form forced: `shared`
// (staged through the ranks' shared areas: the survivors wait on the victim's slot flags) and
// `direct` (the survivors may be reading the victim's buffers when it dies).
TEST(MultiprocKill, DuringAllreduceFourRanks) {
  kill_one_rank(4, {}, {}, "coll_kill");
}
TEST(MultiprocKill, DuringSharedAllreduceFourRanks) {
  kill_one_rank(4, {"ANVIEW_ALGO=allreduce=shared"}, {}, "coll_kill");
}
TEST(MultiprocKill, DuringDirectAllreduceFourRanks) {
  kill_one_rank(4, {"ANVIEW_ALGO=allreduce=direct"}, {}, "coll_kill");
}
TEST(MultiprocKill, DuringRingAllreduceFourRanks) {
  kill_one_rank(4, {"ANVIEW_ALGO=allreduce=ring"}, {}, "coll_kill");
}
// Hierarchical over two emulated hosts: the survivors on the victim's host wait for it inside
// the host, those on the other host for their leader, which waits for the other leader.
TEST(MultiprocKill, DuringHierarchicalAllreduceTwoHosts) {
  kill_one_rank(4, {"ANVIEW_ALGO=allreduce=hierarchical"}, {"--hosts", "2"}, "coll_kill");
}
TEST(MultiprocKill, DuringAllreduceFourRanksTcp) {
  kill_one_rank(4, tcp_only, {}, "coll_kill");
}
// The same through TLS (ANVIEW_TLS=1): a dead peer's end of stream and the survivors' abort
// frames pass through OpenSSL.
TEST(MultiprocKill, TlsFourRanks) {
  kill_one_rank(4, {"ANVIEW_TRANSPORTS=tcp", "ANVIEW_TLS=1"});
}
TEST(MultiprocKill, DuringAllreduceFourRanksTls) {
  kill_one_rank(4, {"ANVIEW_TRANSPORTS=tcp", "ANVIEW_TLS=1"}, {}, "coll_kill");
}

// The victim dies while the survivors' reading from it is paused (unexpected-message budget
// full). Over shm the ring holds what the budget does not (512 KiB), so the preload is sized
// to fill the budget and part of the ring.
TEST(MultiprocKill, WhileReadingIsPaused) {
  kill_one_rank(3, {"ANVIEW_UNEXPECTED_BYTES=64K"}, {"--preload", "262144"});
}
TEST(MultiprocKill, TcpWhileReadingIsPaused) {
  kill_one_rank(3, {"ANVIEW_TRANSPORTS=tcp", "ANVIEW_UNEXPECTED_BYTES=64K"},
                {"--preload", "1048576"});
}

// The same with one stream per peer pair: the only stream is paused, and the dead peer's
// kernel still holds data for it, so no end of stream can arrive until it is read. The
// survivor learns of the death from the peer's pidfd and drains the stream.
TEST(MultiprocKill, TcpWhileTheOnlyStreamIsPaused) {
  kill_one_rank(2,
                {"ANVIEW_TRANSPORTS=tcp", "ANVIEW_TCP_STREAMS=1", "ANVIEW_UNEXPECTED_BYTES=64K",
                 "ANVIEW_TIMEOUT=5"},
                {"--preload", "1048576"});
}

// A rank reading from and writing into the victim's regions (one-sided) when it dies: direct
// over shm (mapped and cross-memory attach), emulated over TCP, both on two emulated hosts.
TEST(MultiprocKill, OneSidedThreeRanks) {
  kill_one_rank(3, {}, {}, "rma_kill");
}
TEST(MultiprocKill, OneSidedThreeRanksTcp) {
  kill_one_rank(3, tcp_only, {}, "rma_kill");
}
TEST(MultiprocKill, OneSidedMixedFourRanks) {
  kill_one_rank(4, {}, {"--hosts", "2"}, "rma_kill");
}

// Over UCX (ANVIEW_TRANSPORTS=ucx): on one host the survivors watch the victim's process (UCX's
// shared memory has no peer failure handling of its own); across emulated hosts they hear of
// it through UCX's endpoint error (err_mode PEER: the TCP connection breaks).
#if defined(ANVIEW_HAVE_UCX)
#define UCX_ONLY() (void)0
#else
#define UCX_ONLY() GTEST_SKIP() << "built without the UCX transport"
#endif
const std::vector<std::string> ucx_tcp{"ANVIEW_TRANSPORTS=ucx", "UCX_TLS=tcp"};
const std::vector<std::string> ucx_shm{"ANVIEW_TRANSPORTS=ucx", "UCX_TLS=sm"};
TEST(MultiprocKill, UcxTcpFourRanks) {
  UCX_ONLY();
  kill_one_rank(4, ucx_tcp);
}
TEST(MultiprocKill, UcxShmFourRanks) {
  UCX_ONLY();
  kill_one_rank(4, ucx_shm);
}
TEST(MultiprocKill, UcxTwoHostsFourRanks) {
  UCX_ONLY();
  kill_one_rank(4, ucx_tcp, {"--hosts", "2"});
}
TEST(MultiprocKill, DuringAllreduceFourRanksUcx) {
  UCX_ONLY();
  kill_one_rank(4, ucx_tcp, {"--hosts", "4"}, "coll_kill");
}
TEST(MultiprocKill, UcxShmNoPidfdFourRanks) {
  UCX_ONLY();
  kill_one_rank(4, ucx_shm, {"--deny-pidfd"});
}
TEST(MultiprocKill, OneSidedThreeRanksUcx) {
  UCX_ONLY();
  kill_one_rank(3, ucx_shm, {}, "rma_kill");
}
// UCX's native RMA (ANVIEW_UCX_RMA=native) to ranks on other hosts: the gets from the victim
// fail through UCX's endpoint error.
TEST(MultiprocKill, OneSidedThreeRanksUcxNative) {
  UCX_ONLY();
  kill_one_rank(3, {"ANVIEW_TRANSPORTS=ucx", "UCX_TLS=tcp", "ANVIEW_UCX_RMA=native"},
                {"--hosts", "3"}, "rma_kill");
}

}  // namespace

namespace {

// SIGSTOP one rank of a 4-rank allreduce loop (coll_stall): within the watchdog interval the
// other ranks' hang doctor logs the call and names the stopped rank as not in it; after
// SIGCONT the job completes.
void stall_one_rank(const std::vector<std::string>& env) {
  TempDir dir;
  std::vector<std::string> all_env = {"ANVIEW_WATCHDOG=400ms", "ANVIEW_LOG_LEVEL=warn",
                                      "ANVIEW_DUMP_DIR=" + dir.path().string()};
  all_env.insert(all_env.end(), env.begin(), env.end());
  const RunResult r = run({ANVIEW_RUN_PATH, "-n", "4", "--timeout", "60", ANVIEW_P2P_CHECK_PATH,
                           "coll_stall", "--result-dir", dir.path().string()},
                          all_env, dir.path(), std::chrono::seconds(80));
  SCOPED_TRACE("anview-run exit code " + std::to_string(r.exit_code) + "\n--- stdout ---\n" +
               r.out + "--- stderr ---\n" + r.err);
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("anview_p2p_check coll_stall: OK"), std::string::npos);
  // Every running rank reported the stalled allreduce, and some report saw the whole picture:
  // the three others in it, rank 3 not.
  for (int rank = 0; rank < 3; ++rank) {
    const std::string prefix =
        " rank " + std::to_string(rank) + " doctor] warn: hang doctor: allreduce #";
    EXPECT_NE(r.err.find(prefix), std::string::npos) << "rank " << rank << " reported nothing";
  }
  EXPECT_NE(r.err.find("In allreduce #"), std::string::npos);
  EXPECT_NE(r.err.find("waiting: ranks 0, 1, 2. Not in it: rank 3 (it has not reached allreduce #"),
            std::string::npos);
  EXPECT_NE(r.err.find("goes on"), std::string::npos) << "no rank said its call went on";
  // The reports also went into the dumps: each running rank's last one shows the allreduce
  // stalled, what it waits for, and the hang doctor's report.
  int dumps = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("anview-dump-", 0) != 0) continue;
    ++dumps;
    SCOPED_TRACE(name);
    const auto dump = nlohmann::json::parse(read_file(entry.path()));
    EXPECT_EQ(dump.at("reason").get<std::string>().rfind("hang doctor: allreduce #", 0), 0u);
    const auto& comm = dump.at("communicators").at(0);
    // Early reports may not yet have the others' notes: rank 3 is among those not in it.
    const std::string report = comm.at("hang_report");
    const auto not_in = report.find("Not in it: ");
    ASSERT_NE(not_in, std::string::npos) << report;
    EXPECT_NE(report.find('3', not_in), std::string::npos) << report;
    bool stalled = false;
    for (const auto& op : comm.at("collectives"))
      stalled = stalled || (op.at("op") == "allreduce" && op.at("state") == "stalled" &&
                            !op.at("waiting_for").get<std::string>().empty());
    EXPECT_TRUE(stalled) << comm.at("collectives").dump();
  }
  EXPECT_EQ(dumps, 3) << "ranks 0-2 each write one dump file (rank 3 never waited)";
}

// ANVIEW_TRACE from a 4-rank run: one valid JSON file holding every rank's track, with its
// collectives and (at the transfers level) its point-to-point transfers.
TEST(MultiprocTrace, FourRanksShareOneValidFile) {
  TempDir dir;
  const fs::path trace = dir.path() / "trace.json";
  const RunResult r = run({ANVIEW_RUN_PATH, "-n", "4", "--timeout", "60", ANVIEW_PERF_PATH,
                           "allreduce", "-b", "64", "-e", "64K", "-n", "20", "-w", "2"},
                          {"ANVIEW_TRACE=" + trace.string(), "ANVIEW_TRACE_DETAIL=transfers",
                           "ANVIEW_ALGO=allreduce=ring"},
                          dir.path(), std::chrono::seconds(80));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto j = nlohmann::json::parse(read_file(trace));
  std::map<int, int> allreduces, transfers, names;
  for (const auto& e : j.at("traceEvents")) {
    const int pid = e.at("pid");
    if (e.at("ph") == "M" && e.at("name") == "process_name") ++names[pid];
    if (e.at("ph") != "X") continue;
    EXPECT_GE(e.at("dur").get<double>(), 0.0);
    // anview-perf's own bookkeeping (the slowest rank's time) is an 8-byte allreduce.
    if (e.at("name") == "allreduce" && e.at("args").at("bytes") >= 64) {
      ++allreduces[pid];
      EXPECT_EQ(e.at("args").at("algorithm"), "ring");
      EXPECT_EQ(e.at("args").at("state"), "done");
    }
    if (e.at("name") == "send" || e.at("name") == "recv") ++transfers[pid];
  }
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(names[rank], 1) << "rank " << rank << "'s track is named once";
    EXPECT_GE(allreduces[rank], 6 * 20) << "rank " << rank;  // 6 sizes (x4), 20 timed iterations
    EXPECT_GT(transfers[rank], allreduces[rank]) << "rank " << rank;
  }
}

// Settings a job gets wrong are told at the start: ANVIEW_TCP_SOCKBUF below 64 KiB (segments
// larger than the receive window stall on the persist timer) is warned of once per rank, and
// a negative one is a usage error naming it.
TEST(MultiprocSettings, ASmallSocketBufferIsWarnedOfAndANegativeOneRefused) {
  TempDir dir;
  const std::vector<std::string> args = {
      ANVIEW_RUN_PATH, "-n", "2", "--timeout", "60",  ANVIEW_PERF_PATH,
      "pingpong",      "-b", "8", "-e",        "64K", "-f",
      "8192",          "-n", "5", "-w",        "1"};
  RunResult r =
      run(args, {"ANVIEW_TRANSPORTS=tcp", "ANVIEW_LOG_LEVEL=warn", "ANVIEW_TCP_SOCKBUF=16K"},
          dir.path(), std::chrono::seconds(80));
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  int warnings = 0;
  for (std::size_t at = 0; (at = r.err.find("ANVIEW_TCP_SOCKBUF=16K (16384 bytes) is below 64 KiB",
                                            at)) != std::string::npos;
       ++at)
    ++warnings;
  EXPECT_EQ(warnings, 2) << r.err;

  r = run(args, {"ANVIEW_TRANSPORTS=tcp", "ANVIEW_TCP_SOCKBUF=-1"}, dir.path(),
          std::chrono::seconds(80));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("ANVIEW_TCP_SOCKBUF"), std::string::npos) << r.err;

  r = run(args, {"ANVIEW_TRANSPORTS=tcp", "ANVIEW_LOG_LEVEL=warn", "ANVIEW_TCP_SOCKBUF=256K"},
          dir.path(), std::chrono::seconds(80));
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.err.find("ANVIEW_TCP_SOCKBUF"), std::string::npos) << r.err;
}

// Two free TCP ports in a row (each rank's endpoint is ANVIEW_METRICS_PORT + its local rank).
int free_port_pair() {
  for (int attempt = 0; attempt < 50; ++attempt) {
    const int base = 20000 + static_cast<int>((::getpid() * 7919 + attempt * 104729) % 30000);
    bool free = true;
    for (int p = base; p < base + 2 && free; ++p) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<std::uint16_t>(p));
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      free = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
      ::close(fd);
    }
    if (free) return base;
  }
  return 0;
}

// Scrape the metrics endpoint during a run (the metrics scenario): counters grow, the text
// parses as the Prometheus exposition format.
TEST(MultiprocMetrics, ScrapeDuringARun) {
  TempDir dir;
  const int port = free_port_pair();
  ASSERT_GT(port, 0) << "no two free ports in a row";
  const RunResult r =
      run({ANVIEW_RUN_PATH, "-n", "2", "--timeout", "60", ANVIEW_P2P_CHECK_PATH, "metrics",
           "--result-dir", dir.path().string()},
          {"ANVIEW_METRICS_PORT=" + std::to_string(port)}, dir.path(), std::chrono::seconds(80));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("anview_p2p_check metrics: OK"), std::string::npos) << r.out;
}

// A blocking receive waiting past ANVIEW_WATCHDOG (p2p_stall): the hang doctor names the
// receive, the rank it waits for and the link, and the dump shows the pending receive.
void p2p_stall(const std::vector<std::string>& env) {
  TempDir dir;
  std::vector<std::string> all_env = {"ANVIEW_WATCHDOG=500ms", "ANVIEW_LOG_LEVEL=warn",
                                      "ANVIEW_DUMP_DIR=" + dir.path().string()};
  all_env.insert(all_env.end(), env.begin(), env.end());
  const RunResult r = run({ANVIEW_RUN_PATH, "-n", "2", "--timeout", "60", ANVIEW_P2P_CHECK_PATH,
                           "p2p_stall", "--result-dir", dir.path().string()},
                          all_env, dir.path(), std::chrono::seconds(60));
  SCOPED_TRACE("--- stdout ---\n" + r.out + "--- stderr ---\n" + r.err);
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_NE(r.err.find(" rank 0 p2p] warn: hang doctor: recv tag=5 from rank 1 has waited "),
            std::string::npos);
  EXPECT_NE(r.err.find("no matching message from rank 1 has arrived; link: "), std::string::npos);
  int dumps = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    if (entry.path().filename().string().rfind("anview-dump-", 0) != 0) continue;
    ++dumps;
    const auto dump = nlohmann::json::parse(read_file(entry.path()));
    EXPECT_EQ(dump.at("reason").get<std::string>().rfind("hang doctor: recv tag=5", 0), 0u);
    bool pending = false;
    for (const auto& req : dump.at("communicators").at(0).at("pending_p2p"))
      pending = pending || (req.at("kind") == "recv" && req.at("peer") == 1 && req.at("tag") == 5);
    EXPECT_TRUE(pending) << dump.dump();
  }
  EXPECT_EQ(dumps, 1) << "rank 0 dumps; rank 1 never waited";
}

TEST(MultiprocStall, HangDoctorNamesAStuckReceive) {
  p2p_stall({});
}
TEST(MultiprocStall, HangDoctorNamesAStuckReceiveTcp) {
  p2p_stall(tcp_only);
}

TEST(MultiprocStall, HangDoctorNamesTheStoppedRank) {
  stall_one_rank({});
}
TEST(MultiprocStall, HangDoctorNamesTheStoppedRankTcp) {
  stall_one_rank(tcp_only);
}

}  // namespace
