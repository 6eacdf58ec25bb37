#include "base/process_watch.hpp"

#include <sys/syscall.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>

namespace anview::base {

std::unique_ptr<ProcessWatch> ProcessWatch::start(ProgressEngine& engine, int pid,
                                                  std::function<void()> on_exit, std::string* why,
                                                  bool* gone) {
  if (pid <= 0) {
    if (why) *why = "no process id";
    return nullptr;
  }
  // glibc 2.36's <sys/pidfd.h> lacks C linkage for C++; the system call is stable.
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) {
    if (gone) *gone = errno == ESRCH;
    if (why) *why = "pidfd_open(" + std::to_string(pid) + "): " + errno_text(errno);
    return nullptr;
  }
  return std::make_unique<ProcessWatch>(engine, Fd(fd), std::move(on_exit));
}

ProcessWatch::ProcessWatch(ProgressEngine& engine, Fd pidfd, std::function<void()> on_exit)
    : engine_(engine), pidfd_(std::move(pidfd)), on_exit_(std::move(on_exit)) {
  engine_.add_fd(pidfd_.get(), EPOLLIN, this);
}

ProcessWatch::~ProcessWatch() {
  if (armed_) engine_.remove_fd(pidfd_.get());
}

bool ProcessWatch::exited() const {
  if (!armed_) return true;
  pollfd p{pidfd_.get(), POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

void ProcessWatch::on_fd_events(std::uint32_t) {
  if (!armed_) return;
  armed_ = false;
  engine_.remove_fd(pidfd_.get());
  on_exit_();
}

}  // namespace anview::base
