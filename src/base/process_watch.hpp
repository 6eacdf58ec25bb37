// Watches another process on this host through a pidfd, which turns readable when the process
// exits: a same-host peer's death is known at once, not at the next timeout.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "base/progress_engine.hpp"

namespace anview::base {

class ProcessWatch final : public FdHandler {
 public:
  // Null when the process cannot be watched (an old kernel, a sandbox; `why` says why) or
  // has already exited (then `gone` is set, when given).
  static std::unique_ptr<ProcessWatch> start(ProgressEngine& engine, int pid,
                                             std::function<void()> on_exit, std::string* why,
                                             bool* gone = nullptr);
  ProcessWatch(ProgressEngine& engine, Fd pidfd, std::function<void()> on_exit);
  ~ProcessWatch() override;
  ProcessWatch(const ProcessWatch&) = delete;
  ProcessWatch& operator=(const ProcessWatch&) = delete;

  void on_fd_events(std::uint32_t events) override;
  // True once the process has exited (polls the pidfd; no need to wait for the engine).
  bool exited() const;

 private:
  ProgressEngine& engine_;
  Fd pidfd_;
  std::function<void()> on_exit_;
  bool armed_ = true;
};

}  // namespace anview::base
