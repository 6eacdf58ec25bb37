#include "output_sink.hpp"

#include <fcntl.h>
#include <limits.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace anview::run {
namespace {

// True when `a` and `b` are open on the same file (2>&1).
bool same_file(int a, int b) {
  struct stat sa {
  }, sb{};
  if (::fstat(a, &sa) != 0 || ::fstat(b, &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// Writable, or failed (a reader that closed its end, a closed fd): the write then says why.
bool writable_now(int fd) {
  pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
  int n;
  do {
    n = ::poll(&p, 1, 0);
  } while (n < 0 && errno == EINTR);
  return n > 0 && (p.revents & (POLLOUT | POLLERR | POLLHUP | POLLNVAL)) != 0;
}

}  // namespace

OutputSink::OutputSink(int fd) : fd_(fd) {
  struct stat st {};
  if (::fcntl(fd, F_GETFD) < 0 || ::fstat(fd, &st) != 0) {
    gone_ = true;
  } else if (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode)) {
    mode_ = Mode::whole;  // never waits for a reader
  } else if (S_ISSOCK(st.st_mode)) {
    mode_ = Mode::socket;
  } else {
    // A pipe, FIFO or terminal: a description of our own, opened non-blocking, so that no
    // write waits and the one the launcher shares with the shell is left as it is.
    nonblocking_.reset(::open(("/proc/self/fd/" + std::to_string(fd)).c_str(),
                              O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
    mode_ = nonblocking_.valid() ? Mode::nonblocking : Mode::chunked;
  }
}

int OutputSink::poll_fd() const {
  return mode_ == Mode::nonblocking ? nonblocking_.get() : fd_;
}

void OutputSink::write(std::string_view data) {
  if (gone_) return;
  queue_.append(data);
  on_writable();
}

ssize_t OutputSink::write_some(const char* data, std::size_t bytes) {
  switch (mode_) {
    case Mode::whole:
      return ::write(fd_, data, bytes);
    case Mode::nonblocking:
      return ::write(nonblocking_.get(), data, bytes);
    case Mode::socket:
      return ::send(fd_, data, bytes, MSG_DONTWAIT | MSG_NOSIGNAL);
    case Mode::chunked:
      // Where no description of our own could be opened: a blocking pipe that polls writable
      // takes PIPE_BUF bytes without waiting.
      if (!writable_now(fd_)) {
        errno = EAGAIN;
        return -1;
      }
      return ::write(fd_, data, std::min<std::size_t>(bytes, PIPE_BUF));
  }
  return -1;
}

void OutputSink::on_writable() {
  // A bounded amount per call, so that a fast target does not keep the loop from the rest.
  std::size_t budget = 4u << 20;
  while (!gone_ && head_ < queue_.size() && budget > 0) {
    const ssize_t written = write_some(queue_.data() + head_, queue_.size() - head_);
    if (written > 0) {
      head_ += static_cast<std::size_t>(written);
      budget -= std::min(budget, static_cast<std::size_t>(written));
    } else if (written < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    } else if (written < 0 && errno != EINTR) {
      gone_ = true;  // EPIPE, EBADF, EIO: the output has nowhere to go; the ranks go on
    }
  }
  if (gone_ || head_ == queue_.size()) {
    drop();
  } else if (head_ >= (1u << 20)) {
    queue_.erase(0, head_);
    head_ = 0;
  }
}

void OutputSink::append_poll_fd(std::vector<pollfd>& fds) const {
  if (queued() > 0) fds.push_back({.fd = poll_fd(), .events = POLLOUT, .revents = 0});
}

LauncherOutput::LauncherOutput()
    : out_(STDOUT_FILENO), err_(STDERR_FILENO), shared_(same_file(STDOUT_FILENO, STDERR_FILENO)) {}

void LauncherOutput::append_poll_fds(std::vector<pollfd>& fds) const {
  out_.append_poll_fd(fds);
  err_.append_poll_fd(fds);
}

void LauncherOutput::on_poll_result(const pollfd& fd) {
  if (fd.revents == 0) return;
  if (fd.fd == out_.poll_fd()) out_.on_writable();
  if (fd.fd == err_.poll_fd()) err_.on_writable();
}

}  // namespace anview::run
