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
  // `owner`: what owner_of_this_thread() says on the pool's threads.
  explicit HandlerPool(int threads, const void* owner = nullptr);
  ~HandlerPool();  // runs what is queued, then joins
  // The owner of the pool whose thread this is, or null (a job can tell it runs on the pool of
  // an object that must not join its own threads from it).
  static const void* owner_of_this_thread();
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
  const void* owner_;
  std::vector<std::thread> threads_;
};

}  // namespace anview::patterns
