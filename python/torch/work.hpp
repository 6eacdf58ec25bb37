// The c10d::Work of one operation of the anview backend: an anview::Request, the tensors it
// uses (kept as long as the work) and the step that finishes it on completion (copying a
// temporary result into the caller's tensors). Completion marks the Work and its Future (what
// DDP's communication hooks chain on) on the thread that completed the request.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "anview/anview.hpp"

namespace anview::torch_backend {

class ProgressHelper;
class Retired;

class AnviewWork final : public c10d::Work {
 public:
  // Runs on success before the work completes; may throw (the work then fails with it).
  using Finish = std::function<void(const Status&)>;

  // `outputs` are the result (Work::result, the Future's value); `held` other tensors the
  // operation reads or writes until it completes. `timeout`: wait()'s default.
  AnviewWork(int rank, c10d::OpType type, const char* profiling_title,
             std::vector<at::Tensor> outputs, std::vector<at::Tensor> held,
             std::chrono::milliseconds timeout);

  // Starts tracking `request`; once complete, the work is parked in `retired`. For
  // point-to-point requests (`helper` set), a Future asked for is completed by the helper's
  // thread, since nothing else drives their progress.
  void start(Request request, Finish finish, std::shared_ptr<Retired> retired,
             std::shared_ptr<ProgressHelper> helper = nullptr);

  bool isCompleted() override;
  bool wait(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override { return outputs_; }
  int sourceRank() const override;

 private:
  // Finishes the work once: run by the request's completion callback, or by a thread that
  // saw the request done first (wait, isCompleted), whichever claims it; the waiter finishing
  // it itself saves a sleep and a wake-up per operation.
  void complete(const Status& status, const Error* error);
  void complete_if_done();

  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> held_;
  std::chrono::milliseconds timeout_;
  Request request_;
  Finish finish_;
  std::weak_ptr<ProgressHelper> helper_;
  std::atomic<bool> claimed_{false};
  Status status_;  // guarded by mutex_ (the base class's)
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// Works completed on one of Anview's threads, parked there until a caller's thread (the
// process group's next operation, or its end) drops them. Dropping the last reference to a
// tensor whose Python object is gone takes the GIL; a thread that tries that while the
// interpreter shuts down is ended by Python with a forced unwind, which std::terminate()s
// the process. So Anview's threads never drop a work's last reference themselves.
class Retired {
 public:
  void park(c10::intrusive_ptr<AnviewWork> work);
  void release();

 private:
  std::mutex mutex_;
  std::vector<c10::intrusive_ptr<AnviewWork>> works_;
};

// A thread that waits on point-to-point requests whose Future someone holds, so the Future
// completes without a wait() on the Work. Started at the first such request, joined with the
// process group.
class ProgressHelper {
 public:
  ~ProgressHelper();
  void watch(Request request);

 private:
  void run();
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Request> pending_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace anview::torch_backend
