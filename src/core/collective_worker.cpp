#include "core/collective_worker.hpp"

#include <exception>
#include <string>

namespace anview::detail {

CollectiveWorker::CollectiveWorker(p2p::Messenger& messenger)
    : messenger_(messenger), thread_([this] { loop(); }) {}

CollectiveWorker::~CollectiveWorker() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CollectiveWorker::submit(p2p::RequestPtr request, std::size_t bytes,
                              std::function<void()> job) {
  {
    std::lock_guard lock(mu_);
    jobs_.push_back(Job{std::move(request), bytes, std::move(job)});
  }
  cv_.notify_one();
}

void CollectiveWorker::loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (stopping_) break;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    std::optional<Error> error;
    try {
      job.run();
    } catch (const Error& e) {
      error = e;
    } catch (const std::exception& e) {
      error = Error(
          ErrorKind::internal,
          {.rank = messenger_.rank(), .operation = job.request->operation, .cause = e.what()});
    }
    messenger_.finish_external(*job.request, std::move(error), job.bytes);
  }
  // Closing: what never ran fails, so nobody waits for it forever.
  std::deque<Job> left;
  {
    std::lock_guard lock(mu_);
    left.swap(jobs_);
  }
  for (auto& job : left) {
    messenger_.finish_external(
        *job.request,
        Error(ErrorKind::usage, {.rank = messenger_.rank(),
                                 .operation = job.request->operation,
                                 .cause = "the communicator was closed before the collective ran"}),
        0);
  }
}

}  // namespace anview::detail
