#include "work.hpp"

#include <ATen/core/jit_type.h>

#include <utility>

namespace anview::torch_backend {

AnviewWork::AnviewWork(int rank, c10d::OpType type, const char* profiling_title,
                       std::vector<at::Tensor> outputs, std::vector<at::Tensor> held,
                       std::chrono::milliseconds timeout)
    : c10d::Work(rank, type, profiling_title),
      outputs_(std::move(outputs)),
      held_(std::move(held)),
      timeout_(timeout),
      future_(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
}

void AnviewWork::start(Request request, Finish finish, std::shared_ptr<Retired> retired,
                       std::shared_ptr<ProgressHelper> helper) {
  request_ = request;
  finish_ = std::move(finish);
  helper_ = helper;
  // The callback owns a reference until it has run, then parks it (see Retired).
  auto self = c10::intrusive_ptr<AnviewWork>::unsafe_reclaim_from_nonowning(this);
  request.on_complete(
      [self, retired = std::move(retired)](const Status& status, const Error* error) mutable {
        self->complete(status, error);
        retired->park(std::move(self));
      });
}

void AnviewWork::complete(const Status& status, const Error* error) {
  if (claimed_.exchange(true)) return;
  std::exception_ptr failure;
  if (error != nullptr) {
    failure = std::make_exception_ptr(*error);
  } else {
    try {
      if (finish_) finish_(status);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  {
    std::lock_guard lock(mutex_);
    status_ = status;
  }
  finish(failure);  // c10d::Work: completed_, exception_, wakes wait()
  if (failure)
    future_->setError(failure);
  else
    future_->markCompleted(c10::IValue(outputs_));
}

void AnviewWork::complete_if_done() {
  if (!claimed_.load() && request_.done()) complete(request_.status(), request_.error());
}

bool AnviewWork::isCompleted() {
  if (!request_.done()) request_.test();
  complete_if_done();
  std::lock_guard lock(mutex_);
  return completed_;
}

bool AnviewWork::wait(std::chrono::milliseconds timeout) {
  // Waiting on the request drives its progress (point-to-point) and raises anview's timeout
  // error, which names the operation and the peer.
  if (!request_.done()) {
    try {
      request_.wait(timeout == kNoTimeout ? timeout_ : timeout);
    } catch (const Error&) {
      if (!request_.done()) throw;  // a timeout: the operation is still pending
    }
  }
  complete_if_done();
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return completed_; });  // the completion callback is running
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> AnviewWork::getFuture() {
  if (auto helper = helper_.lock(); helper && !request_.done()) helper->watch(request_);
  return future_;
}

int AnviewWork::sourceRank() const {
  std::lock_guard lock(mutex_);
  return status_.source;
}

void Retired::park(c10::intrusive_ptr<AnviewWork> work) {
  std::lock_guard lock(mutex_);
  works_.push_back(std::move(work));
}

void Retired::release() {
  std::vector<c10::intrusive_ptr<AnviewWork>> works;
  {
    std::lock_guard lock(mutex_);
    works.swap(works_);
  }
}  // dropped here, on the caller's thread, outside the lock

ProgressHelper::~ProgressHelper() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ProgressHelper::watch(Request request) {
  std::lock_guard lock(mutex_);
  pending_.push_back(std::move(request));
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  wake_.notify_all();
}

void ProgressHelper::run() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    if (pending_.empty()) {
      wake_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
      continue;
    }
    std::vector<Request> requests = std::move(pending_);
    pending_.clear();
    lock.unlock();
    // Drive progress in short turns so a stop is seen; a failed request completes its work
    // with its error through the callback.
    for (auto& r : requests) r.test();
    std::erase_if(requests, [](Request& r) { return r.done(); });
    if (!requests.empty()) {
      try {
        requests.front().wait(std::chrono::milliseconds(20));
      } catch (const Error&) {
        // a timeout of this short turn, or the request's own error (already delivered)
      }
    }
    lock.lock();
    for (auto& r : requests)
      if (!r.done()) pending_.push_back(std::move(r));
  }
}

}  // namespace anview::torch_backend
