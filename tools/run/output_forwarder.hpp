// Line forwarding for `anview-run --tag-output`: every rank writes its stdout and stderr into
// pipes, and the launcher copies them to its own stdout and stderr with each line prefixed by
// "[rank] ". Whole lines only: a line is queued whole on the launcher's output (output_sink.hpp),
// never split and never mixed with another rank's line (the launcher is the only writer).
// The one exception is a line longer than `max_line_bytes` without a newline, which is
// emitted in pieces of that size so that a rank cannot make the launcher buffer without bound.
#pragma once

#include <poll.h>

#include <cstddef>
#include <string>
#include <vector>

#include "base/socket.hpp"
#include "output_sink.hpp"

namespace anview::run {

class OutputForwarder {
 public:
  static constexpr std::size_t max_line_bytes = 1 << 20;

  // The write ends of one rank's pipes, for the child to dup2 onto fds 1 and 2. Both are
  // close-on-exec, so no other child inherits them; the parent closes its copies after fork.
  struct RankPipes {
    base::Fd stdout_write;
    base::Fd stderr_write;
  };

  explicit OutputForwarder(LauncherOutput& output) : output_(output) {}
  OutputForwarder(const OutputForwarder&) = delete;
  OutputForwarder& operator=(const OutputForwarder&) = delete;

  // Creates the two pipes of `rank`. Raises an internal Error when pipe2 fails.
  RankPipes add_rank(int rank);

  // One pollfd (POLLIN) per stream that has not reached end of file and whose target is not
  // full (a rank whose lines cannot go out waits in its own writes).
  void append_poll_fds(std::vector<pollfd>& fds);

  // Reads once from the stream behind `fd` (poll said it is readable or hung up) and writes
  // the complete lines. Unknown fds are ignored.
  void on_readable(int fd);

  // Reads what `rank` has written so far without blocking (up to 1 MiB per stream, even when
  // its target is full): called when the rank has been reaped, so that its last lines come
  // out before the launcher's verdict on it.
  void drain_rank(int rank);

  // Drains every stream without blocking (up to 1 MiB each, while its target holds less than
  // 64 MiB), queues unterminated last lines with a newline added and closes all pipes. Output
  // that a rank's leftover children write later is dropped.
  void finish();

 private:
  struct Stream {
    int rank;
    OutputSink* target;   // the launcher's stdout or stderr
    base::Fd read_end;    // invalid once end of file was seen
    std::string partial;  // bytes after the last newline
  };

  // Reads one chunk; false when nothing more is available now (EAGAIN) or the stream ended.
  bool read_chunk(Stream& stream);
  void emit_lines(Stream& stream);
  void flush_partial(Stream& stream);

  LauncherOutput& output_;
  std::vector<Stream> streams_;
};

}  // namespace anview::run
