// The thread that runs a communicator's collectives once a nonblocking one was issued
// (iallreduce, ...). Every rank must run its collectives in one order; with nonblocking ones in
// flight, blocking ones queue behind them on the same thread, so the order is the order of the
// calls. Started on the first nonblocking collective: a program that never issues one has no
// extra thread.
//
// A thread that waits for a queued collective which is next in line and not started runs it
// itself (the request's run_here hook, called by Messenger::wait): the common "start, then
// wait at once" (torch's synchronous collectives) then costs no thread hand-off.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "p2p/messenger.hpp"

namespace anview::detail {

class CollectiveWorker {
 public:
  CollectiveWorker();
  // Lets the running collective finish (on this thread or a waiter's), fails the queued ones
  // ("the communicator was closed"), joins the thread.
  ~CollectiveWorker();
  CollectiveWorker(const CollectiveWorker&) = delete;
  CollectiveWorker& operator=(const CollectiveWorker&) = delete;

  // Queues `job`; `request` (Messenger::external_request) completes when it returns, with
  // `bytes` in its status, or with the Error it throws. `caller_waits`: the caller waits for
  // it at once (a blocking collective) and runs it itself when it is next, so the thread is
  // not woken for it (it takes it on its own once the jobs ahead of it are done).
  void submit(p2p::RequestPtr request, std::size_t bytes, std::function<void()> job,
              bool caller_waits = false);

 private:
  struct Job {
    p2p::RequestPtr request;
    std::size_t bytes;
    std::function<void()> run;
  };
  // Shared with the requests' run_here hooks, which hold it weakly: a hook called after the
  // worker is gone finds it expired or stopping and does nothing.
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Job> jobs;
    // A job's collective runs, on the thread or on a waiter. Cleared before its request
    // completes: its callbacks do not hold up the next collective.
    bool running = false;
    bool stopping = false;
  };
  // The thread's and the waiters' side touch the queue and the jobs' requests (which hold the
  // messenger), never the worker: it may be gone while they run.
  static void loop(const std::shared_ptr<Queue>& queue);
  // Runs `request`'s job on the calling thread if it is first in the queue and none runs.
  static bool run_here(Queue& q, const p2p::RequestImpl* request);
  // Runs the job's collective; the Error it ended with, if any.
  static std::optional<Error> execute(Job& job);

  std::shared_ptr<Queue> queue_ = std::make_shared<Queue>();
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace anview::detail
