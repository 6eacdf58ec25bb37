// The thread that runs a communicator's collectives once a nonblocking one was issued
// (iallreduce, ...). Every rank must run its collectives in one order; with nonblocking ones in
// flight, blocking ones queue behind them on the same thread, so the order is the order of the
// calls. Started on the first nonblocking collective: a program that never issues one has no
// extra thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "p2p/messenger.hpp"

namespace anview::detail {

class CollectiveWorker {
 public:
  explicit CollectiveWorker(p2p::Messenger& messenger);
  // Lets the running collective finish, fails the queued ones ("the communicator was closed"),
  // joins the thread.
  ~CollectiveWorker();
  CollectiveWorker(const CollectiveWorker&) = delete;
  CollectiveWorker& operator=(const CollectiveWorker&) = delete;

  // Queues `job`; `request` (Messenger::external_request) completes when it returns, with
  // `bytes` in its status, or with the Error it throws.
  void submit(p2p::RequestPtr request, std::size_t bytes, std::function<void()> job);

 private:
  struct Job {
    p2p::RequestPtr request;
    std::size_t bytes;
    std::function<void()> run;
  };
  void loop();

  p2p::Messenger& messenger_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace anview::detail
