#include "base/process_watch.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "base/log.hpp"

namespace anview::base {
namespace {

enum class ProcState { running, gone, unreadable };

// What a /proc/PID/stat file open at `fd` says of its process: running (then `start_time` is
// its start time), gone (it was reaped: the open file reads ESRCH even when the pid has been
// reused since; or it is a zombie: it exited and its parent has not reaped it yet), or
// unreadable (`why` says why).
ProcState read_stat(int fd, std::uint64_t& start_time, std::string* why) {
  char text[1024];
  const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
  if (n < 0 && errno == ESRCH) return ProcState::gone;
  if (n <= 0) {
    if (why)
      *why = std::string("reading /proc/PID/stat: ") + (n < 0 ? base::errno_text(errno) : "empty");
    return ProcState::unreadable;
  }
  text[n] = '\0';
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses; the fields after the
  // last ')' are the state (field 3) and, further on, the start time (field 22).
  const char* p = std::strrchr(text, ')');
  if (p == nullptr || p[1] != ' ' || p[2] == '\0') {
    if (why) *why = "/proc/PID/stat has no state field";
    return ProcState::unreadable;
  }
  const char state = p[2];
  if (state == 'Z' || state == 'X' || state == 'x') return ProcState::gone;
  p += 3;  // at the space that ends field 3
  for (int field = 4; field <= 22 && p != nullptr; ++field) {
    p = std::strchr(p, ' ');
    if (p != nullptr) ++p;  // at the start of field `field`
  }
  char* end = nullptr;
  start_time = p != nullptr ? std::strtoull(p, &end, 10) : 0;
  if (p == nullptr || end == p) {
    if (why) *why = "/proc/PID/stat has no start time field";
    return ProcState::unreadable;
  }
  return ProcState::running;
}

}  // namespace

std::unique_ptr<ProcessWatch> ProcessWatch::start(ProgressEngine& engine, int pid,
                                                  std::function<void()> on_exit, std::string* why,
                                                  bool* gone) {
  if (pid <= 0) {
    if (why) *why = "no process id";
    return nullptr;
  }
  // glibc 2.36's <sys/pidfd.h> lacks C linkage for C++; the system call is stable.
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd >= 0)
    return std::unique_ptr<ProcessWatch>(
        new ProcessWatch(engine, Fd(fd), Method::pidfd, Fd(), 0, std::move(on_exit)));
  if (errno == ESRCH) {
    if (gone) *gone = true;
    if (why) *why = "pidfd_open(" + std::to_string(pid) + "): " + errno_text(errno);
    return nullptr;
  }
  const std::string refused = "pidfd_open(" + std::to_string(pid) + "): " + errno_text(errno);
  std::string poll_why;
  auto watch = start_polling(engine, pid, std::move(on_exit), &poll_why, gone);
  if (!watch && why) *why = refused + "; " + poll_why;
  static std::atomic<bool> told{false};
  if (watch && !told.exchange(true))
    log("base", LogLevel::info, refused, ": same-host peers are watched by reading /proc every ",
        poll_interval.count(), " ms instead");
  return watch;
}

std::unique_ptr<ProcessWatch> ProcessWatch::start_polling(ProgressEngine& engine, int pid,
                                                          std::function<void()> on_exit,
                                                          std::string* why, bool* gone) {
  if (pid <= 0) {
    if (why) *why = "no process id";
    return nullptr;
  }
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  Fd stat(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!stat.valid() && errno != ENOENT && errno != ESRCH) {
    if (why) *why = "open(" + path + "): " + errno_text(errno);
    return nullptr;
  }
  std::uint64_t start_time = 0;
  switch (stat.valid() ? read_stat(stat.get(), start_time, why) : ProcState::gone) {
    case ProcState::gone:
      if (gone) *gone = true;
      if (why) *why = "process " + std::to_string(pid) + " has exited";
      return nullptr;
    case ProcState::unreadable:
      return nullptr;
    case ProcState::running:
      break;
  }
  Fd timer(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  if (!timer.valid()) {
    if (why) *why = "timerfd_create: " + errno_text(errno);
    return nullptr;
  }
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(poll_interval).count();
  const timespec every{static_cast<time_t>(ns / 1'000'000'000),
                       static_cast<long>(ns % 1'000'000'000)};
  const itimerspec spec{every, every};
  if (::timerfd_settime(timer.get(), 0, &spec, nullptr) != 0) {
    if (why) *why = "timerfd_settime: " + errno_text(errno);
    return nullptr;
  }
  return std::unique_ptr<ProcessWatch>(new ProcessWatch(engine, std::move(timer), Method::proc_poll,
                                                        std::move(stat), start_time,
                                                        std::move(on_exit)));
}

ProcessWatch::ProcessWatch(ProgressEngine& engine, Fd fd, Method method, Fd stat,
                           std::uint64_t start_time, std::function<void()> on_exit)
    : engine_(engine),
      fd_(std::move(fd)),
      method_(method),
      stat_(std::move(stat)),
      start_time_(start_time),
      on_exit_(std::move(on_exit)) {
  engine_.add_fd(fd_.get(), EPOLLIN, this);
}

ProcessWatch::~ProcessWatch() {
  if (armed_) engine_.remove_fd(fd_.get(), this);
}

bool ProcessWatch::exited() const {
  if (!armed_) return true;
  if (method_ == Method::pidfd) {
    pollfd p{fd_.get(), POLLIN, 0};
    return ::poll(&p, 1, 0) == 1;
  }
  std::uint64_t start_time = 0;
  // Unreadable now although it was readable at the start: not taken for an exit (the peer's
  // other signs, its stream or a timeout, still tell).
  const ProcState state = read_stat(stat_.get(), start_time, nullptr);
  return state == ProcState::gone || (state == ProcState::running && start_time != start_time_);
}

void ProcessWatch::on_fd_events(std::uint32_t) {
  if (!armed_) return;
  if (method_ == Method::proc_poll) {
    std::uint64_t expirations = 0;
    [[maybe_unused]] ssize_t n = ::read(fd_.get(), &expirations, sizeof expirations);
    if (!exited()) return;
  }
  armed_ = false;
  engine_.remove_fd(fd_.get(), this);
  on_exit_();
}

}  // namespace anview::base
