#include "output_sink.hpp"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace anview::run {
namespace {

// Writes to a regular file or a block device do not wait for a reader: they go whole.
bool waits_for_a_reader(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return false;
  return !S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode);
}

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

OutputSink::OutputSink(int fd) : fd_(fd), chunked_(waits_for_a_reader(fd)) {
  if (::fcntl(fd, F_GETFD) < 0) gone_ = true;
}

void OutputSink::write(std::string_view data) {
  if (gone_) return;
  queue_.append(data);
  on_writable();
}

void OutputSink::on_writable() {
  // A bounded amount per call, so that a fast target does not keep the loop from the rest.
  std::size_t budget = 4u << 20;
  while (!gone_ && head_ < queue_.size() && budget > 0) {
    // A blocking pipe that polls writable takes PIPE_BUF bytes without blocking; a target that
    // is non-blocking says EAGAIN instead.
    std::size_t n = queue_.size() - head_;
    if (chunked_) {
      if (!writable_now(fd_)) break;
      n = std::min<std::size_t>(n, PIPE_BUF);
    }
    const ssize_t written = ::write(fd_, queue_.data() + head_, n);
    if (written > 0) {
      head_ += static_cast<std::size_t>(written);
      budget -= std::min(budget, static_cast<std::size_t>(written));
    } else if (written < 0 && errno == EAGAIN) {
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
  if (queued() > 0) fds.push_back({.fd = fd_, .events = POLLOUT, .revents = 0});
}

LauncherOutput::LauncherOutput()
    : out_(STDOUT_FILENO), err_(STDERR_FILENO), shared_(same_file(STDOUT_FILENO, STDERR_FILENO)) {}

void LauncherOutput::append_poll_fds(std::vector<pollfd>& fds) const {
  out_.append_poll_fd(fds);
  err_.append_poll_fd(fds);
}

void LauncherOutput::on_poll_result(const pollfd& fd) {
  if (fd.revents == 0) return;
  if (fd.fd == out_.fd()) out_.on_writable();
  if (fd.fd == err_.fd()) err_.on_writable();
}

}  // namespace anview::run
