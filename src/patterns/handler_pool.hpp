// The threads that run RPC handlers. Jobs run in the order they were queued (several at once on
// several threads). An idle thread spins for a few microseconds before it sleeps, so a server
// answering back-to-back calls does not pay a wake-up per call.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace anview::patterns {

class HandlerPool {
 public:
  explicit HandlerPool(int threads);
  ~HandlerPool();  // runs what is queued, then joins
  HandlerPool(const HandlerPool&) = delete;
  HandlerPool& operator=(const HandlerPool&) = delete;

  void post(std::function<void()> job);

 private:
  void run();
  bool take(std::function<void()>& job);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::atomic<std::size_t> queued_{0};
  int sleeping_ = 0;  // under mu_
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace anview::patterns
