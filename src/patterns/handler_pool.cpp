#include "patterns/handler_pool.hpp"

#include <chrono>

#include "base/log.hpp"

namespace anview::patterns {
namespace {
constexpr auto idle_spin = std::chrono::microseconds(50);
}

HandlerPool::HandlerPool(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
}

HandlerPool::~HandlerPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void HandlerPool::post(std::function<void()> job) {
  bool wake;
  {
    std::lock_guard lock(mu_);
    jobs_.push_back(std::move(job));
    queued_.fetch_add(1, std::memory_order_release);
    wake = sleeping_ > 0;
  }
  if (wake) cv_.notify_one();
}

bool HandlerPool::take(std::function<void()>& job) {
  std::unique_lock lock(mu_);
  for (;;) {
    if (!jobs_.empty()) {
      job = std::move(jobs_.front());
      jobs_.pop_front();
      queued_.fetch_sub(1, std::memory_order_relaxed);
      return true;
    }
    if (stopping_) return false;
    ++sleeping_;
    cv_.wait(lock);
    --sleeping_;
  }
}

void HandlerPool::run() {
  std::function<void()> job;
  for (;;) {
    // Spin a little for the next job before sleeping on the condition variable.
    const auto spin_end = std::chrono::steady_clock::now() + idle_spin;
    while (queued_.load(std::memory_order_acquire) == 0 &&
           std::chrono::steady_clock::now() < spin_end)
      std::this_thread::yield();
    if (!take(job)) return;
    try {
      job();
    } catch (const std::exception& e) {  // jobs answer their own calls; this is a bug
      base::log("rpc", base::LogLevel::error, "handler job raised: ", e.what());
    }
    job = nullptr;
  }
}

}  // namespace anview::patterns
