// Watches another process on this host, so that a same-host peer's death is known at once, not
// at the next timeout. A pidfd turns readable when the process exits. Where pidfd_open is
// refused (kernels before 5.3; sandboxes whose seccomp profile predates it, such as older
// container runtimes' defaults), a timer reads /proc/PID/stat every poll_interval instead,
// through a file opened at the start: the process is gone when that file reads ESRCH (it was
// reaped; a reused pid does not revive it), when it is a zombie, or when its start time changed.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "base/progress_engine.hpp"
#include "base/socket.hpp"

namespace anview::base {

class ProcessWatch final : public FdHandler {
 public:
  enum class Method { pidfd, proc_poll };
  static constexpr std::chrono::milliseconds poll_interval{100};

  // Null when the process cannot be watched either way (`why` says why) or has already exited
  // (then `gone` is set, when given).
  static std::unique_ptr<ProcessWatch> start(ProgressEngine& engine, int pid,
                                             std::function<void()> on_exit, std::string* why,
                                             bool* gone = nullptr);
  // The /proc method only: what start() falls back to (and what its tests use).
  static std::unique_ptr<ProcessWatch> start_polling(ProgressEngine& engine, int pid,
                                                     std::function<void()> on_exit,
                                                     std::string* why, bool* gone = nullptr);
  ~ProcessWatch() override;
  ProcessWatch(const ProcessWatch&) = delete;
  ProcessWatch& operator=(const ProcessWatch&) = delete;

  Method method() const { return method_; }
  // proc_poll: the process's start time (field 22 of /proc/PID/stat), else 0.
  std::uint64_t start_time() const { return start_time_; }
  void on_fd_events(std::uint32_t events) override;
  // True once the process has exited (asks the pidfd or /proc now; no need to wait for the
  // engine).
  bool exited() const;

 private:
  ProcessWatch(ProgressEngine& engine, Fd fd, Method method, Fd stat, std::uint64_t start_time,
               std::function<void()> on_exit);

  ProgressEngine& engine_;
  Fd fd_;  // the pidfd, or the polling timer
  Method method_;
  Fd stat_;  // proc_poll: /proc/PID/stat, held open (it reads ESRCH once the process is reaped)
  std::uint64_t start_time_;  // proc_poll: the process's start time (clock ticks after boot)
  std::function<void()> on_exit_;
  bool armed_ = true;
};

}  // namespace anview::base
