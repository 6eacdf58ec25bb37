#include "base/progress_engine.hpp"

#include "base/log.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>

namespace anview::base {

void ProgressEngine::WakeupDrain::on_fd_events(std::uint32_t) {
  std::uint64_t value;
  [[maybe_unused]] ssize_t r = ::read(fd, &value, sizeof value);
}

ProgressEngine::ProgressEngine()
    : epoll_(::epoll_create1(EPOLL_CLOEXEC)), wakeup_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (!epoll_.valid()) throw sys_error(ErrorKind::internal, {}, "epoll_create1()", errno);
  if (!wakeup_fd_.valid()) throw sys_error(ErrorKind::internal, {}, "eventfd()", errno);
  wakeup_drain_.fd = wakeup_fd_.get();
  control(EPOLL_CTL_ADD, wakeup_fd_.get(), EPOLLIN, &wakeup_drain_);
}

void ProgressEngine::control(int op, int fd, std::uint32_t events, FdHandler* handler) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = handler;
  if (::epoll_ctl(epoll_.get(), op, fd, &ev) != 0)
    throw sys_error(ErrorKind::internal, {},
                    op == EPOLL_CTL_ADD ? "epoll_ctl(ADD)" : "epoll_ctl(MOD)", errno);
}

void ProgressEngine::add_fd(int fd, std::uint32_t events, FdHandler* handler) {
  control(EPOLL_CTL_ADD, fd, events, handler);
  if (any_removed_.load(std::memory_order_acquire)) {  // a new handler where a removed one was
    std::lock_guard lock(removed_mu_);
    std::erase(removed_, handler);
  }
}

void ProgressEngine::modify_fd(int fd, std::uint32_t events, FdHandler* handler) {
  control(EPOLL_CTL_MOD, fd, events, handler);
}

void ProgressEngine::remove_fd(int fd, FdHandler* handler) {
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  if (handler == nullptr) return;
  std::lock_guard lock(removed_mu_);
  removed_.push_back(handler);
  any_removed_.store(true, std::memory_order_release);
}

bool ProgressEngine::was_removed(FdHandler* handler) {
  if (!any_removed_.load(std::memory_order_acquire)) return false;
  std::lock_guard lock(removed_mu_);
  return std::find(removed_.begin(), removed_.end(), handler) != removed_.end();
}

void ProgressEngine::add_poller(std::function<bool()> poller, std::function<bool()> has_work) {
  if (!has_work) every_poller_has_hint_ = false;
  pollers_.push_back({std::move(poller), std::move(has_work)});
}

bool ProgressEngine::pollers_may_have_work() const {
  if (!every_poller_has_hint_) return true;
  for (const auto& p : pollers_)
    if (p.has_work()) return true;
  return false;
}

void ProgressEngine::add_sleep_hooks(std::function<bool()> before_sleep,
                                     std::function<void()> after_wake) {
  before_sleep_.push_back(std::move(before_sleep));
  after_wake_.push_back(std::move(after_wake));
}

void ProgressEngine::wakeup() {
  const std::uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wakeup_fd_.get(), &one, sizeof one);
}

bool ProgressEngine::run_pollers(bool hinted_only) {
  bool busy = false;
  for (auto& p : pollers_) {
    if (hinted_only && p.has_work && !p.has_work()) continue;
    busy |= p.poll();
  }
  return busy;
}

namespace {
std::atomic<std::uint64_t> overlapping_waits_seen{0};
}  // namespace

std::uint64_t ProgressEngine::overlapping_waits() {
  return overlapping_waits_seen.load(std::memory_order_relaxed);
}

int ProgressEngine::wait_events(int timeout_ms) {
  // The check costs one exchange next to a system call.
  if (in_wait_.exchange(true, std::memory_order_acquire) &&
      overlapping_waits_seen.fetch_add(1, std::memory_order_relaxed) == 0) {
    log("engine", LogLevel::error,
        "internal error: two threads poll one progress engine at once (events of one may be "
        "dispatched by the other)");
  }
  const bool sleeping = timeout_ms != 0 && !before_sleep_.empty();
  if (sleeping) {
    for (auto& hook : before_sleep_)
      if (!hook()) timeout_ms = 0;
  }
  int n;
  do {
    n = ::epoll_wait(epoll_.get(), events_, max_events, timeout_ms);
  } while (n < 0 && errno == EINTR);
  if (sleeping)
    for (auto& hook : after_wake_) hook();
  in_wait_.store(false, std::memory_order_release);
  return n < 0 ? 0 : n;
}

void ProgressEngine::dispatch_events(int count) {
  for (int i = 0; i < count; ++i) {
    auto* handler = static_cast<FdHandler*>(events_[i].data.ptr);
    // Removed by name since wait_events() collected the round: by a handler before it in the
    // round, or by another thread between wait_events() and this dispatch.
    if (was_removed(handler)) continue;
    handler->on_fd_events(events_[i].events);
  }
  if (any_removed_.load(std::memory_order_acquire)) {
    std::lock_guard lock(removed_mu_);
    removed_.clear();
    any_removed_.store(false, std::memory_order_release);
  }
}

bool ProgressEngine::poll(int timeout_ms) {
  const bool busy = run_pollers();
  const int n = wait_events(busy ? 0 : timeout_ms);
  dispatch_events(n);
  return busy || n > 0;
}

}  // namespace anview::base
