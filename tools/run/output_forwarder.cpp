#include "output_forwarder.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <string_view>

namespace anview::run {
namespace {

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
    streams_.push_back(Stream{.rank = rank,
                              .target = target == STDOUT_FILENO ? &output_.out() : &output_.err(),
                              .read_end = std::move(read_end),
                              .partial = {}});
    (target == STDOUT_FILENO ? pipes.stdout_write : pipes.stderr_write) = std::move(write_end);
  }
  return pipes;
}

void OutputForwarder::append_poll_fds(std::vector<pollfd>& fds) {
  for (const Stream& s : streams_) {
    if (s.read_end.valid() && !s.target->full())
      fds.push_back({.fd = s.read_end.get(), .events = POLLIN, .revents = 0});
  }
}

void OutputForwarder::on_readable(int fd) {
  for (Stream& s : streams_) {
    if (s.read_end.valid() && s.read_end.get() == fd) {
      if (!s.target->full()) read_chunk(s);  // full: another stream of the round filled it
      return;
    }
  }
}

void OutputForwarder::drain_rank(int rank) {
  for (Stream& s : streams_) {
    // Even past the sink's high water, so that the rank's last lines come before the verdict:
    // what its pipe holds, and at most 1 MiB of what leftover children go on writing.
    if (s.rank == rank) {
      for (int chunks = 0; chunks < 16 && read_chunk(s); ++chunks) {
      }
    }
  }
}

void OutputForwarder::finish() {
  // A bounded read per stream: what is still in the pipe, not what an escaped process that
  // holds it open goes on writing.
  for (Stream& s : streams_) {
    for (int chunks = 0;
         chunks < 16 && s.target->queued() < 16 * OutputSink::high_water && read_chunk(s);
         ++chunks) {
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
  stream.target->write(out);
}

void OutputForwarder::flush_partial(Stream& stream) {
  if (stream.partial.empty()) return;
  std::string out;
  append_line(out, stream.rank, stream.partial);
  stream.partial.clear();
  stream.target->write(out);
}

}  // namespace anview::run
