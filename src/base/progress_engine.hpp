// The progress engine: one per communicator. File descriptors (TCP sockets via epoll) and
// pollers (in-process queues, later shared-memory rings) plug into it. It has no thread of its
// own: whoever drives progress calls poll().
//
// Threading: add/modify/remove and wakeup may be called from any thread. poll() (or
// wait_events() then dispatch_events()) must be called by one thread at a time (the
// "driver"); the owner of the engine serialises that. Handlers run on the driver's thread,
// inside poll(), and must not call poll() on their own engine.
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "base/socket.hpp"

namespace anview::base {

class FdHandler {
 public:
  virtual ~FdHandler() = default;
  // `events` is the epoll event mask (EPOLLIN, EPOLLOUT, EPOLLERR, EPOLLHUP, ...).
  virtual void on_fd_events(std::uint32_t events) = 0;
};

class ProgressEngine {
 public:
  ProgressEngine();
  ProgressEngine(const ProgressEngine&) = delete;
  ProgressEngine& operator=(const ProgressEngine&) = delete;

  // Events of one poll() round are collected before handlers run, so a handler whose fd is
  // removed during a round may still be called once in that round: owners keep a removed
  // handler alive (ignoring events) until the next poll() starts, or name it to remove_fd().
  // Then its events collected and not yet dispatched are dropped, whether it was removed by
  // a handler of the round or by another thread after wait_events(), and it may be destroyed
  // at once.
  void add_fd(int fd, std::uint32_t events, FdHandler* handler);
  void modify_fd(int fd, std::uint32_t events, FdHandler* handler);
  void remove_fd(int fd, FdHandler* handler = nullptr);

  // A poller is called on every poll(); it returns true when it did work. A poller with work
  // pending keeps poll() from sleeping. Pollers are added once and live as long as the engine.
  // `has_work`, when given, tells cheaply and without the owner's lock (atomics only) whether
  // the poller may have something to do; a spinning owner then skips rounds that would do
  // nothing (see pollers_may_have_work()).
  void add_poller(std::function<bool()> poller, std::function<bool()> has_work = {});
  // False when every poller has a has_work hint and none reports work: a round of
  // run_pollers() would do nothing. Runs on the driver's thread, possibly without the lock.
  bool pollers_may_have_work() const;

  // Hooks around sleeping, for pollers whose peers must be told to wake us (shared-memory
  // rings): before_sleep() runs before wait_events() sleeps and returns false when work
  // arrived meanwhile (then it does not sleep); after_wake() runs when it returns. Both run
  // on the driver's thread, possibly without the owner's lock: they may touch only state
  // that is safe for that (atomics).
  void add_sleep_hooks(std::function<bool()> before_sleep, std::function<void()> after_wake);

  // Runs pollers and the handlers of ready fds. Sleeps up to timeout_ms (0: do not sleep, -1:
  // no limit) when there is nothing to do. Returns true when anything happened.
  bool poll(int timeout_ms);

  // poll() in three steps, so an owner can sleep in wait_events() without holding its lock:
  // run_pollers() (true: work was done, do not sleep), wait_events(), dispatch_events().
  // `hinted_only`: skips the pollers whose has_work hint says no (a spinning owner's round
  // after a hint said yes: a message that came over one transport does not wait for the
  // others' pollers; the owner's periodic full rounds run every poller).
  bool run_pollers(bool hinted_only = false);
  int wait_events(int timeout_ms);
  void dispatch_events(int count);
  // Times, in this process, that a thread entered wait_events() while another was in it: the
  // one-driver rule above broken (the events of one would be dispatched by the other). Logged
  // at error level the first time; tests check it stays 0.
  static std::uint64_t overlapping_waits();
  // Makes a sleeping poll() return now (another thread queued work).
  void wakeup();

 private:
  void control(int op, int fd, std::uint32_t events, FdHandler* handler);

  Fd epoll_;
  Fd wakeup_fd_;
  // Drains wakeup_fd_: a handler like any other, so dispatch needs no marker value in epoll's
  // user data (once, a null marker was taken for a removed handler: the wakeup fd was never
  // drained, and every waiter spun instead of sleeping).
  struct WakeupDrain final : FdHandler {
    int fd = -1;
    void on_fd_events(std::uint32_t events) override;
  } wakeup_drain_;
  struct Poller {
    std::function<bool()> poll;
    std::function<bool()> has_work;  // empty: none given
  };
  std::vector<Poller> pollers_;
  bool every_poller_has_hint_ = true;
  std::vector<std::function<bool()>> before_sleep_;
  std::vector<std::function<void()>> after_wake_;
  static constexpr int max_events = 64;
  epoll_event events_[max_events];
  std::atomic<bool> in_wait_{false};  // a thread is in wait_events() (the rule's check)
  // Handlers removed by name since the last dispatch: their events collected before the
  // removal are skipped (a removed handler may be destroyed at once). Under removed_mu_,
  // since removal may come from another thread; any_removed_ keeps rounds without removals
  // off the mutex.
  bool was_removed(FdHandler* handler);
  std::mutex removed_mu_;
  std::vector<FdHandler*> removed_;
  std::atomic<bool> any_removed_{false};
};

}  // namespace anview::base
