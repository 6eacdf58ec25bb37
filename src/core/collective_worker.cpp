#include "core/collective_worker.hpp"

#include <exception>
#include <string>
#include <thread>

namespace anview::detail {

CollectiveWorker::CollectiveWorker() : thread_([queue = queue_] { loop(queue); }) {}

CollectiveWorker::~CollectiveWorker() {
  Queue& q = *queue_;
  {
    std::unique_lock lock(q.mu);
    q.stopping = true;
    if (thread_.get_id() == std::this_thread::get_id()) {
      // Destroyed by a completion callback on this very thread (it held the communicator's
      // last handle): a thread cannot join itself. A waiter may be running the next collective
      // (run_here), which uses the communicator: that one ends first, as join() would wait for
      // it. Then the thread ends on its own: loop() holds the queue, and reaches the Messenger
      // through the jobs' requests; nothing of it uses `this`.
      q.cv.wait(lock, [&] { return !q.running; });
      lock.unlock();
      q.cv.notify_all();
      thread_.detach();
      return;
    }
  }
  q.cv.notify_all();
  thread_.join();
}

void CollectiveWorker::submit(p2p::RequestPtr request, std::size_t bytes, std::function<void()> job,
                              bool caller_waits) {
  // Not `this`: the hook may be called after the worker is gone, while a detached thread
  // still holds the queue.
  request->run_here = [weak = std::weak_ptr<Queue>(queue_), raw = request.get()] {
    const auto queue = weak.lock();
    return queue && run_here(*queue, raw);
  };
  {
    std::lock_guard lock(queue_->mu);
    queue_->jobs.push_back(Job{std::move(request), bytes, std::move(job)});
  }
  if (!caller_waits) queue_->cv.notify_one();
}

bool CollectiveWorker::run_here(Queue& q, const p2p::RequestImpl* request) {
  Job job;
  {
    std::lock_guard lock(q.mu);
    if (q.stopping || q.running || q.jobs.empty() || q.jobs.front().request.get() != request)
      return false;
    job = std::move(q.jobs.front());
    q.jobs.pop_front();
    q.running = true;
  }
  auto error = execute(job);
  bool wake;
  {
    std::lock_guard lock(q.mu);
    q.running = false;
    wake = !q.jobs.empty() || q.stopping;  // the thread: the next job; closing: none runs now
  }
  if (wake) q.cv.notify_all();  // else the thread sleeps on: waking it for nothing costs a core
  // The request holds the messenger: it outlives this call even when the worker is gone.
  job.request->owner->finish_external(job.request, std::move(error), job.bytes);
  return true;
}

std::optional<Error> CollectiveWorker::execute(Job& job) {
  try {
    job.run();
  } catch (const Error& e) {
    return e;
  } catch (const std::exception& e) {
    return Error(ErrorKind::internal, {.rank = job.request->owner->rank(),
                                       .operation = job.request->operation,
                                       .cause = e.what()});
  }
  return std::nullopt;
}

void CollectiveWorker::loop(const std::shared_ptr<Queue>& queue) {
  Queue& q = *queue;
  for (;;) {
    Job job;
    {
      std::unique_lock lock(q.mu);
      q.cv.wait(lock, [&] { return q.stopping || (!q.jobs.empty() && !q.running); });
      if (q.stopping) {
        q.cv.wait(lock, [&] { return !q.running; });  // a waiter's job finishes first
        break;
      }
      job = std::move(q.jobs.front());
      q.jobs.pop_front();
      q.running = true;
    }
    auto error = execute(job);
    {
      std::lock_guard lock(q.mu);
      q.running = false;
    }
    // Completed with the queue free: a waiter may start the next collective while this one's
    // callbacks (user code: a torch future's, say) still run here.
    job.request->owner->finish_external(job.request, std::move(error), job.bytes);
  }
  // Closing: what never ran fails, so nobody waits for it forever.
  std::deque<Job> left;
  {
    std::lock_guard lock(q.mu);
    left.swap(q.jobs);
  }
  for (auto& job : left) {
    p2p::Messenger& messenger = *job.request->owner;  // the request holds it
    messenger.finish_external(
        job.request,
        Error(ErrorKind::usage, {.rank = messenger.rank(),
                                 .operation = job.request->operation,
                                 .cause = "the communicator was closed before the collective ran"}),
        0);
  }
}

}  // namespace anview::detail
