#include "launcher.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string_view>

#include "base/auth.hpp"
#include "base/clock.hpp"
#include "base/huge_pages.hpp"
#include "base/socket.hpp"
#include "bootstrap/launch_env.hpp"
#include "output_forwarder.hpp"

namespace anview::run {
namespace {

using base::Clock;

// After SIGKILL, how long to wait for the killed processes to be reaped before giving up on
// processes that escaped their rank's process group.
constexpr std::chrono::milliseconds reap_after_kill{1000};
// While waiting for the leftover children of ranks that have already ended (they are not
// always our children, so their end may raise no SIGCHLD), how often to look again.
constexpr int leftover_poll_ms = 20;

const ErrorContext launcher_context{.operation = "anview-run"};

// One line on stderr, written at once: in a rank's child before exec only (the launcher's own
// lines go through its queued output, Job::say).
void say_now(const std::string& message) {
  const std::string line = "anview-run: " + message + "\n";
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
}

// "signal 9 (SIGKILL)".
std::string signal_text(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return "signal " + std::to_string(sig) + " (" + (abbrev ? "SIG" + std::string(abbrev) : "?") +
         ")";
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? "SIG" + std::string(abbrev) : "signal " + std::to_string(sig);
}

// "5 s", "1.5 s".
std::string seconds_text(std::chrono::milliseconds duration) {
  std::ostringstream out;
  out << static_cast<double>(duration.count()) / 1000.0 << " s";
  return out.str();
}

// "rank 2", "ranks 0-1, 3". `ranks` is sorted.
std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(ranks[j]);
    }
    i = j + 1;
  }
  return out;
}

// "127.0.0.1:<port>" where port was free a moment ago (bound with port 0, then released).
std::string free_root_address() {
  const auto bind_addr = base::SockAddr::from_host_port("127.0.0.1", 0, launcher_context);
  const base::Fd listener = base::listen_tcp(bind_addr, 1, launcher_context);
  return "127.0.0.1:" + std::to_string(base::local_address(listener.get()).port());
}

struct RankProcess {
  int rank = 0;
  pid_t pid = -1;            // also the process group id
  bool running = false;      // started and not reaped yet
  bool group_alive = false;  // the process group may still have members
  bool signalled = false;    // the launcher signalled it before it ended
};

// How far the job is on its way to the end.
enum class Phase {
  running,      // nothing has gone wrong
  grace,        // a rank failed; the others may still end on their own
  terminating,  // the ranks' groups were sent SIGTERM (or the signal the launcher received)
  killed,       // the ranks' groups were sent SIGKILL
};

class Job {
 public:
  explicit Job(const LaunchOptions& options);
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  // Normally every rank has been reaped by now; after an error, kills and reaps the rest.
  ~Job();

  void start();
  int wait();  // the poll loop; returns the exit code

 private:
  [[noreturn]] void exec_rank(int rank, const std::vector<char*>& argv,
                              OutputForwarder::RankPipes pipes, int dev_null,
                              pid_t launcher_pid) noexcept;
  // One line on the launcher's stderr, queued behind what is not written yet.
  void say(const std::string& message);
  // After the job: writes out what is queued while the reader takes it; a signal that stops
  // the job (INT, TERM, HUP, QUIT) drops it instead.
  void flush_output();
  void on_signals();
  void reap();
  void on_rank_ended(RankProcess& rank, int status);
  void on_deadline();
  // Sends `sig` to the process group of every rank whose group lives (to the rank itself where
  // the group is gone and the rank is not).
  void signal_groups(int sig);
  void stop(int sig, Phase phase, std::chrono::milliseconds next_step);
  void update_groups();
  std::vector<int> ranks_where(bool RankProcess::*flag) const;
  void stop_leftovers();
  bool finished() const;

  const LaunchOptions& options_;
  std::vector<RankProcess> ranks_;
  LauncherOutput output_;
  std::optional<OutputForwarder> forwarder_;
  base::Fd signal_fd_;
  sigset_t old_mask_{};
  Clock::time_point job_deadline_ = Clock::time_point::max();
  Phase phase_ = Phase::running;
  Clock::time_point phase_deadline_ = Clock::time_point::max();
  int stop_signal_ = 0;  // what the groups were last sent
  int first_failed_rank_ = -1;
  std::optional<int> exit_code_;  // set by the first cause of the job's end, never changed
};

Job::Job(const LaunchOptions& options) : options_(options) {
  if (options.tag_output) forwarder_.emplace(output_);
  // Block the signals the loop handles and read them from a signalfd instead. SIGCHLD must not
  // be ignored (children would be reaped behind our back); SIGPIPE is ignored so that a closed
  // stdout drops output instead of killing the launcher. Children get both back in exec_rank.
  ::signal(SIGCHLD, SIG_DFL);
  ::signal(SIGPIPE, SIG_IGN);
  sigset_t mask;
  sigemptyset(&mask);
  // SIGHUP too: a dropped ssh session must stop the ranks as SIGTERM does, not kill the
  // launcher alone (its ranks would get SIGKILL from PR_SET_PDEATHSIG, with no chance to
  // clean up, and their children would live on).
  // SIGQUIT (Ctrl-\) stops the job as SIGINT does; SIGUSR1 and SIGUSR2 are passed on to the
  // ranks, which go on (an Anview rank writes its flight recorder on SIGUSR1; Slurm's --signal
  // and checkpointing scripts send them). Left at their default, each killed the launcher alone.
  for (const int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2})
    sigaddset(&mask, sig);
  ::sigprocmask(SIG_BLOCK, &mask, &old_mask_);
  signal_fd_.reset(::signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!signal_fd_.valid())
    throw base::sys_error(ErrorKind::internal, launcher_context, "signalfd", errno);
  // Children that a rank leaves behind become ours when the rank ends, so we reap them and can
  // tell when a rank's process group is empty.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  if (options.timeout) job_deadline_ = Clock::now() + *options.timeout;
}

Job::~Job() {
  for (RankProcess& r : ranks_) {
    if (!r.running) continue;
    ::kill(-r.pid, SIGKILL);
    ::kill(r.pid, SIGKILL);
    ::waitpid(r.pid, nullptr, 0);
  }
  // A SIGUSR1/SIGUSR2 that came after the loop read its last signal would take its default
  // action once unblocked and kill the launcher as it exits, with the wrong status: the job is
  // over, so they are ignored from here on, and what is pending is read away.
  ::signal(SIGUSR1, SIG_IGN);
  ::signal(SIGUSR2, SIG_IGN);
  signalfd_siginfo info;
  while (::read(signal_fd_.get(), &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
  }
  ::sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
}

void Job::start() {
  const std::string root = free_root_address();
  std::vector<char*> argv;
  for (const std::string& arg : options_.command) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  const base::Fd dev_null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!dev_null.valid())
    throw base::sys_error(ErrorKind::internal, launcher_context, "open /dev/null", errno);
  const pid_t launcher_pid = ::getpid();
  const std::string world = std::to_string(options_.world_size);
  ::setenv("ANVIEW_WORLD_SIZE", world.c_str(), 1);
  ::setenv("ANVIEW_LOCAL_WORLD_SIZE", world.c_str(), 1);
  ::setenv("ANVIEW_ROOT", root.c_str(), 1);
  // Every connection of the job proves this secret (SECURITY.md); one given is kept.
  if (std::getenv("ANVIEW_SECRET") == nullptr && std::getenv("ANVIEW_SECRET_FILE") == nullptr)
    ::setenv("ANVIEW_SECRET", base::auth::fresh_secret().c_str(), 1);
  if (const auto tunables =
          malloc_tunables(std::getenv("GLIBC_TUNABLES"), options_.malloc_huge_pages)) {
    ::setenv("GLIBC_TUNABLES", tunables->c_str(), 1);
  }

  ranks_.reserve(static_cast<std::size_t>(options_.world_size));
  for (int rank = 0; rank < options_.world_size; ++rank) {
    OutputForwarder::RankPipes pipes;
    if (forwarder_) pipes = forwarder_->add_rank(rank);
    const pid_t pid = ::fork();
    if (pid < 0) {
      throw base::sys_error(ErrorKind::internal, launcher_context,
                            "fork for rank " + std::to_string(rank), errno);
    }
    if (pid == 0) exec_rank(rank, argv, std::move(pipes), dev_null.get(), launcher_pid);
    // Also here, so that the group exists before we might signal it. Fails harmlessly once the
    // child has exec'd (EACCES), which means the child has done it itself.
    ::setpgid(pid, pid);
    ranks_.push_back(
        {.rank = rank, .pid = pid, .running = true, .group_alive = true, .signalled = false});
  }
}

void Job::exec_rank(int rank, const std::vector<char*>& argv, OutputForwarder::RankPipes pipes,
                    int dev_null, pid_t launcher_pid) noexcept {
  // In the forked child. The launcher is single-threaded, so allocating here is safe.
  ::setpgid(0, 0);
  // Die with the launcher even when it is killed with SIGKILL and cannot stop us.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher_pid) ::_exit(exit_signal_base + SIGKILL);
  ::dup2(dev_null, STDIN_FILENO);
  if (pipes.stdout_write.valid()) {
    ::dup2(pipes.stdout_write.get(), STDOUT_FILENO);
    ::dup2(pipes.stderr_write.get(), STDERR_FILENO);
  }
  ::signal(SIGPIPE, SIG_DFL);
  ::sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
  const std::string rank_text = std::to_string(rank);
  ::setenv("ANVIEW_RANK", rank_text.c_str(), 1);
  ::setenv("ANVIEW_LOCAL_RANK", rank_text.c_str(), 1);
  if (options_.emulate_hosts > 0) {
    const auto host = bootstrap::emulated_host(rank, options_.world_size, options_.emulate_hosts);
    ::setenv("ANVIEW_HOST_ID", host.id.c_str(), 1);
    ::setenv("ANVIEW_LOCAL_RANK", std::to_string(rank - host.first_rank).c_str(), 1);
    ::setenv("ANVIEW_LOCAL_WORLD_SIZE", std::to_string(host.ranks).c_str(), 1);
  }
  ::execvp(argv[0], argv.data());
  say_now("rank " + rank_text + ": cannot execute '" + argv[0] + "': " + base::errno_text(errno));
  ::_exit(exit_exec_failed);
}

int Job::wait() {
  std::vector<pollfd> fds;
  while (!finished()) {
    fds.clear();
    fds.push_back({.fd = signal_fd_.get(), .events = POLLIN, .revents = 0});
    output_.append_poll_fds(fds);
    const std::size_t first_stream = fds.size();
    if (forwarder_) forwarder_->append_poll_fds(fds);
    const Clock::time_point deadline = std::min(job_deadline_, phase_deadline_);
    int timeout_ms = deadline == Clock::time_point::max() ? -1 : base::ms_left(deadline);
    if (ranks_where(&RankProcess::running).empty()) {  // only leftovers in the groups remain
      timeout_ms = timeout_ms < 0 ? leftover_poll_ms : std::min(timeout_ms, leftover_poll_ms);
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      throw base::sys_error(ErrorKind::internal, launcher_context, "poll", errno);
    }
    for (std::size_t i = 1; i < first_stream; ++i) output_.on_poll_result(fds[i]);
    // Output first, so that a rank's last lines come before the launcher's verdict on it.
    for (std::size_t i = first_stream; i < fds.size(); ++i) {
      if (fds[i].revents != 0) forwarder_->on_readable(fds[i].fd);
    }
    if (fds[0].revents != 0) on_signals();
    reap();
    update_groups();
    stop_leftovers();
    if (Clock::now() >= std::min(job_deadline_, phase_deadline_) && !finished()) on_deadline();
  }
  if (forwarder_) forwarder_->finish();
  flush_output();
  return exit_code_.value_or(0);
}

void Job::say(const std::string& message) {
  output_.err().write("anview-run: " + message + "\n");
}

void Job::flush_output() {
  // A job that was stopped (a failure, --timeout, a signal) waits for its reader no longer than
  // it gave its ranks to end after SIGTERM; one that ended by itself waits as cat would, until
  // its --timeout if it has one.
  const bool stopped = phase_ != Phase::running;
  const Clock::time_point deadline = stopped ? Clock::now() + options_.kill_after : job_deadline_;
  const auto give_up = [&](const std::string& why) {
    const std::size_t dropped = output_.out().queued() + output_.err().queued();
    output_.drop();
    say(why + " while " + std::to_string(dropped) +
        " bytes of output waited for their reader; dropping them");
  };
  std::vector<pollfd> fds;
  while (output_.queued()) {
    if (Clock::now() >= deadline) {
      if (stopped) {
        give_up("the job was stopped " + seconds_text(options_.kill_after) + " ago");
      } else {
        if (!exit_code_) exit_code_ = exit_timeout;
        give_up("the job ran past --timeout " + seconds_text(*options_.timeout));
      }
      return;
    }
    fds.clear();
    fds.push_back({.fd = signal_fd_.get(), .events = POLLIN, .revents = 0});
    output_.append_poll_fds(fds);
    const int timeout_ms = deadline == Clock::time_point::max() ? -1 : base::ms_left(deadline);
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) return;
    for (std::size_t i = 1; i < fds.size(); ++i) output_.on_poll_result(fds[i]);
    if (fds[0].revents == 0) continue;
    signalfd_siginfo info;
    while (::read(signal_fd_.get(), &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD) reap();  // leftover children that ended meanwhile
      if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT) {
        // The reader does not read, and the user gave up waiting for it.
        if (!exit_code_) exit_code_ = exit_signal_base + sig;
        give_up("received " + signal_name(sig));
        return;
      }
    }
  }
}

void Job::on_signals() {
  signalfd_siginfo info;
  while (::read(signal_fd_.get(), &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
    const int sig = static_cast<int>(info.ssi_signo);
    if (sig == SIGCHLD) continue;  // reap() runs after every wake-up
    if (sig == SIGUSR1 || sig == SIGUSR2) {
      say("received " + signal_name(sig) + "; passing it to " +
          rank_list(ranks_where(&RankProcess::group_alive)));
      signal_groups(sig);
      continue;
    }
    if (phase_ == Phase::terminating || phase_ == Phase::killed) {
      say("received " + signal_name(sig) + " again; sending SIGKILL to " +
          rank_list(ranks_where(&RankProcess::group_alive)));
      stop(SIGKILL, Phase::killed, reap_after_kill);
      continue;
    }
    if (!exit_code_) exit_code_ = exit_signal_base + sig;
    // A hangup is the terminal's, not the ranks': they are told to terminate.
    const int forward = sig == SIGHUP ? SIGTERM : sig;
    say("received " + signal_name(sig) + "; sending " +
        (forward == sig ? std::string("it") : signal_name(forward)) + " to " +
        rank_list(ranks_where(&RankProcess::running)));
    stop(forward, Phase::terminating, options_.kill_after);
  }
}

void Job::reap() {
  int status = 0;
  pid_t pid;
  while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
    // Anything else is a child a rank left behind (we are a subreaper): reaped and forgotten.
    const auto it = std::find_if(ranks_.begin(), ranks_.end(),
                                 [pid](const RankProcess& r) { return r.pid == pid; });
    if (it != ranks_.end() && it->running) on_rank_ended(*it, status);
  }
}

void Job::on_rank_ended(RankProcess& rank, int status) {
  rank.running = false;
  if (forwarder_) forwarder_->drain_rank(rank.rank);
  const int code = WIFSIGNALED(status) ? exit_signal_base + WTERMSIG(status) : WEXITSTATUS(status);
  if (code == 0) return;
  // A rank that ends after we signalled it was stopped, not failing on its own: the line about
  // the signal we sent already says what happened to it.
  if (!rank.signalled) {
    say("rank " + std::to_string(rank.rank) + " (pid " + std::to_string(rank.pid) + ") " +
        (WIFSIGNALED(status) ? "was killed by " + signal_text(WTERMSIG(status))
                             : "exited with code " + std::to_string(code)));
  }
  if (exit_code_) return;
  exit_code_ = code;
  first_failed_rank_ = rank.rank;
  const std::vector<int> others = ranks_where(&RankProcess::running);
  if (phase_ == Phase::running && !others.empty()) {
    say("rank " + std::to_string(rank.rank) + " failed; waiting up to " +
        seconds_text(options_.grace) + " for " + rank_list(others) +
        " to exit before sending SIGTERM");
    phase_ = Phase::grace;
    phase_deadline_ = Clock::now() + options_.grace;
  }
}

void Job::on_deadline() {
  const auto now = Clock::now();
  const std::vector<int> running = ranks_where(&RankProcess::running);
  const std::vector<int> alive = ranks_where(&RankProcess::group_alive);
  switch (phase_) {
    case Phase::running:
    case Phase::grace:
      if (now >= job_deadline_) {
        if (!exit_code_) exit_code_ = exit_timeout;
        say("job ran past --timeout " + seconds_text(*options_.timeout) + "; " +
            rank_list(running) + " still running; sending SIGTERM");
      } else {
        say(rank_list(running) + " still running " + seconds_text(options_.grace) + " after rank " +
            std::to_string(first_failed_rank_) + " failed; sending SIGTERM");
      }
      stop(SIGTERM, Phase::terminating, options_.kill_after);
      break;
    case Phase::terminating:
      say("processes of " + rank_list(alive) + " still alive " + seconds_text(options_.kill_after) +
          " after " + signal_name(stop_signal_) + "; sending SIGKILL");
      stop(SIGKILL, Phase::killed, reap_after_kill);
      break;
    case Phase::killed:
      if (!alive.empty()) {
        say("processes of " + rank_list(alive) + " outlived SIGKILL; giving up on them");
      }
      for (RankProcess& r : ranks_) r.group_alive = r.running;
      phase_deadline_ = Clock::time_point::max();
      break;
  }
}

// Signals every process group that may still have members. A rank that no longer has its own
// group (it moved to another one) is signalled alone.
void Job::signal_groups(int sig) {
  for (const RankProcess& r : ranks_) {
    if (!r.group_alive) continue;
    if (::kill(-r.pid, sig) != 0 && r.running) ::kill(r.pid, sig);
  }
}

void Job::stop(int sig, Phase phase, std::chrono::milliseconds next_step) {
  signal_groups(sig);
  for (RankProcess& r : ranks_)
    if (r.group_alive && r.running) r.signalled = true;
  stop_signal_ = sig;
  job_deadline_ = Clock::time_point::max();  // the job is being stopped already
  phase_ = phase;
  phase_deadline_ = Clock::now() + next_step;
}

// A rank's group is gone once the rank is reaped and nothing else is left in it. Checked on
// every wake-up, so that a group id is never signalled after the kernel could reuse it.
void Job::update_groups() {
  for (RankProcess& r : ranks_) {
    if (r.group_alive && !r.running && ::kill(-r.pid, 0) != 0 && errno == ESRCH) {
      r.group_alive = false;
    }
  }
}

std::vector<int> Job::ranks_where(bool RankProcess::*flag) const {
  std::vector<int> out;
  for (const RankProcess& r : ranks_) {
    if (r.*flag) out.push_back(r.rank);
  }
  return out;
}

// Every rank has exited, but processes they started are left in their process groups (a
// data loader, a background job): they belong to the job and are stopped with it, SIGTERM
// then SIGKILL, instead of living on after anview-run has exited. The exit code stays the
// ranks'.
void Job::stop_leftovers() {
  if (phase_ != Phase::running && phase_ != Phase::grace) return;
  if (!ranks_where(&RankProcess::running).empty()) return;
  const std::vector<int> left = ranks_where(&RankProcess::group_alive);
  if (left.empty()) return;
  say("every rank has exited; processes left in the process groups of " + rank_list(left) +
      " still run; sending SIGTERM");
  stop(SIGTERM, Phase::terminating, options_.kill_after);
}

// Done when every rank has been reaped and everything left in the ranks' process groups is
// gone too.
bool Job::finished() const {
  return ranks_where(&RankProcess::running).empty() &&
         ranks_where(&RankProcess::group_alive).empty();
}

}  // namespace

int run_job(const LaunchOptions& options) {
  Job job(options);
  job.start();
  return job.wait();
}

std::optional<std::string> malloc_tunables(const char* inherited, bool huge_pages) {
  const std::string_view name = base::malloc_huge_pages_tunable;
  // A value of the user's own is kept, whatever it is.
  if (!huge_pages || base::glibc_tunable(inherited, name)) return std::nullopt;
  std::string tunables(inherited != nullptr ? inherited : "");
  if (!tunables.empty()) tunables += ':';
  return tunables.append(name).append("=1");
}

}  // namespace anview::run
