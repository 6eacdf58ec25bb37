#include "output_forwarder.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <string_view>

namespace anview::run {
namespace {

// Writes all of `data`, waiting when the target is a full non-blocking pipe. Output that cannot
// be written (the reader went away: EPIPE) is dropped; the ranks keep running.
void write_all_or_drop(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n >= 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
    } else if (errno == EAGAIN) {
      pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
      ::poll(&p, 1, -1);
    } else if (errno != EINTR) {
      return;
    }
  }
}

void append_line(std::string& out, int rank, std::string_view line) {
  out += '[';
  out += std::to_string(rank);
  out += "] ";
  out += line;
  out += '\n';
}

}  // namespace

OutputForwarder::RankPipes OutputForwarder::add_rank(int rank) {
  RankPipes pipes;
  for (const int target : {STDOUT_FILENO, STDERR_FILENO}) {
    int ends[2];
    if (::pipe2(ends, O_CLOEXEC) != 0) {
      throw base::sys_error(ErrorKind::internal, {.operation = "anview-run --tag-output"},
                            "pipe2 for the output of rank " + std::to_string(rank), errno);
    }
    base::Fd read_end(ends[0]);
    base::Fd write_end(ends[1]);
    base::set_nonblocking(read_end.get(), true);
    streams_.push_back(
        Stream{.rank = rank, .target_fd = target, .read_end = std::move(read_end), .partial = {}});
    (target == STDOUT_FILENO ? pipes.stdout_write : pipes.stderr_write) = std::move(write_end);
  }
  return pipes;
}

void OutputForwarder::append_poll_fds(std::vector<pollfd>& fds) const {
  for (const Stream& s : streams_) {
    if (s.read_end.valid()) fds.push_back({.fd = s.read_end.get(), .events = POLLIN, .revents = 0});
  }
}

void OutputForwarder::on_readable(int fd) {
  for (Stream& s : streams_) {
    if (s.read_end.valid() && s.read_end.get() == fd) {
      read_chunk(s);
      return;
    }
  }
}

void OutputForwarder::drain_rank(int rank) {
  for (Stream& s : streams_) {
    if (s.rank == rank) {
      while (read_chunk(s)) {
      }
    }
  }
}

void OutputForwarder::finish() {
  for (Stream& s : streams_) {
    while (read_chunk(s)) {
    }
    flush_partial(s);
    s.read_end.reset();
  }
}

bool OutputForwarder::read_chunk(Stream& stream) {
  if (!stream.read_end.valid()) return false;
  char buffer[64 * 1024];
  ssize_t n;
  do {
    n = ::read(stream.read_end.get(), buffer, sizeof(buffer));
  } while (n < 0 && errno == EINTR);
  if (n < 0 && errno == EAGAIN) return false;
  if (n <= 0) {  // end of file, or an error that ends the stream just the same
    flush_partial(stream);
    stream.read_end.reset();
    return false;
  }
  stream.partial.append(buffer, static_cast<std::size_t>(n));
  emit_lines(stream);
  return true;
}

void OutputForwarder::emit_lines(Stream& stream) {
  std::string out;
  std::string_view rest = stream.partial;
  for (auto newline = rest.find('\n'); newline != std::string_view::npos;
       newline = rest.find('\n')) {
    append_line(out, stream.rank, rest.substr(0, newline));
    rest.remove_prefix(newline + 1);
  }
  while (rest.size() >= max_line_bytes) {
    append_line(out, stream.rank, rest.substr(0, max_line_bytes));
    rest.remove_prefix(max_line_bytes);
  }
  if (out.empty()) return;
  stream.partial.erase(0, stream.partial.size() - rest.size());
  write_all_or_drop(stream.target_fd, out);
}

void OutputForwarder::flush_partial(Stream& stream) {
  if (stream.partial.empty()) return;
  std::string out;
  append_line(out, stream.rank, stream.partial);
  stream.partial.clear();
  write_all_or_drop(stream.target_fd, out);
}

}  // namespace anview::run
