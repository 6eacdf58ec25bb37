// The flight recorders' dumps for the whole process. Every live communicator registers a
// source of its state as JSON (its recorder, its pending point-to-point requests, its peers);
// a dump is one document with all of them, written
//   - after an error and when the hang doctor reports a stall (write(), write_after_error()),
//   - on SIGUSR1, unless the program handles that signal itself,
//   - on request: while communicators live, the process answers on the abstract unix socket
//     "anview-dump-<pid>" to connections of its own user (or root), which anview-info --dump
//     makes (request()).
// Files go to ANVIEW_DUMP_DIR (default /tmp) as anview-dump-<pid>.json, each dump replacing
// the previous one, and the log says where.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/clock.hpp"
#include "base/socket.hpp"

namespace anview::detail {

class DumpService {
 public:
  using Source = std::function<nlohmann::ordered_json()>;

  static DumpService& instance();

  // The first source starts the listening thread and the SIGUSR1 handler; the last one to go
  // stops the thread. remove() waits for a dump in progress, so the source may go away after.
  std::uint64_t add(Source source);
  void remove(std::uint64_t id);

  // {"anview_version", "pid", "host", "time", "reason", "communicators": [...]}.
  nlohmann::ordered_json snapshot(const std::string& reason);
  // Writes the dump file; its path, or empty when it could not be written (logged).
  std::string write(const std::string& reason) noexcept;
  // write() for an error, at most once a second (an error storm rewrites one file).
  void write_after_error(const std::string& what) noexcept;

  static std::string path_for(pid_t pid);
  // anview-info's side: the pids on this host (network namespace) that answer dump requests,
  // and one process's dump (an Error naming the pid when it does not answer in time).
  static std::vector<pid_t> listening_pids();
  static nlohmann::ordered_json request(pid_t pid, std::chrono::milliseconds timeout);

 private:
  DumpService() = default;
  // Both with lifecycle_mu_ held.
  void start();
  void stop();
  void serve(int wake_fd, int listen_fd);
  void answer(int client_fd);

  std::mutex lifecycle_mu_;  // add() and remove(): starting and stopping the thread
  std::mutex mu_;            // sources_, last_error_dump_
  std::map<std::uint64_t, Source> sources_;
  std::uint64_t next_id_ = 1;
  std::mutex dump_mu_;  // one dump at a time; remove() takes it so sources outlive dumps
  std::thread thread_;  // these four: lifecycle_mu_
  base::Fd wake_read_, wake_write_;  // SIGUSR1 and stop() write here
  base::Fd listen_;
  base::Clock::time_point last_error_dump_{};
};

}  // namespace anview::detail
