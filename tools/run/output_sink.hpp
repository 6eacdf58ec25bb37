// Everything anview-run writes to its own stdout and stderr (its messages, and the ranks' lines
// under --tag-output) goes through an OutputSink: queued, and written from the launcher's poll
// loop only as much as the target takes without blocking (through a non-blocking description
// of its own for a pipe or terminal, so that a terminal with little room or other writers to
// the same pipe cannot make a write wait either). A reader that stops reading (a
// paused pager, a stalled ssh session, a full pipe) then delays the output only: the launcher
// still forwards signals, sees ranks end and keeps --timeout. Before, a blocking write froze
// the whole launcher, so Ctrl-C and --timeout did nothing until the reader went on.
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "base/socket.hpp"

namespace anview::run {

class OutputSink {
 public:
  // Past this many queued bytes, the forwarder stops reading the ranks' pipes (they then wait
  // in their own writes, as they would writing to the target directly).
  static constexpr std::size_t high_water = 4u << 20;

  explicit OutputSink(int fd);
  OutputSink(const OutputSink&) = delete;
  OutputSink& operator=(const OutputSink&) = delete;

  // Queues `data` and writes what the target takes now. Dropped once the target is gone (its
  // reader closed it: EPIPE; or it is not open).
  void write(std::string_view data);
  // Writes what the target takes now; called when poll() said it is writable.
  void on_writable();
  // Queued bytes not written yet.
  std::size_t queued() const { return queue_.size() - head_; }
  bool full() const { return queued() >= high_water; }
  // A POLLOUT pollfd when bytes are queued.
  void append_poll_fd(std::vector<pollfd>& fds) const;
  // What to poll for POLLOUT.
  int poll_fd() const;
  // Drops what is queued (the launcher is told to stop while its reader does not read).
  void drop() { queue_.clear(), head_ = 0; }

 private:
  enum class Mode {
    whole,        // a regular file or block device: plain writes
    nonblocking,  // a pipe, FIFO or terminal: through nonblocking_
    socket,       // send() with MSG_DONTWAIT
    chunked,      // no description of our own: PIPE_BUF bytes after POLLOUT
  };
  ssize_t write_some(const char* data, std::size_t bytes);

  int fd_;
  Mode mode_ = Mode::whole;
  base::Fd nonblocking_;  // the target opened again (/proc/self/fd/N) with O_NONBLOCK
  bool gone_ = false;
  std::string queue_;
  std::size_t head_ = 0;  // bytes of queue_ already written
};

// The launcher's stdout and stderr. When both are the same file (2>&1), one sink serves both,
// so that their lines stay whole and in order.
class LauncherOutput {
 public:
  LauncherOutput();
  OutputSink& out() { return out_; }
  OutputSink& err() { return shared_ ? out_ : err_; }
  void append_poll_fds(std::vector<pollfd>& fds) const;
  void on_poll_result(const pollfd& fd);
  bool queued() const { return out_.queued() > 0 || err_.queued() > 0; }
  void drop() { out_.drop(), err_.drop(); }

 private:
  OutputSink out_;
  OutputSink err_;
  bool shared_;
};

}  // namespace anview::run
