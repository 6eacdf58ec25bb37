// anview::Request — the handle of one non-blocking operation (isend / irecv).
//
// A request completes once: successfully (status() tells source, tag and bytes) or with an
// anview::Error. The buffer given to isend/irecv must stay valid until then. Copies of a handle
// share the operation. Any thread may call any method; progress is driven by the thread that
// waits or tests (no background thread): wait() spins briefly, then sleeps in the kernel.
#pragma once

#include <chrono>
#include <coroutine>
#include <functional>
#include <memory>
#include <optional>

#include "anview/error.hpp"
#include "anview/types.hpp"

namespace anview {

namespace detail {
class RequestImpl;
}

class Request {
 public:
  // Called once, when the request completes; `error` is null on success. Runs on the thread
  // that drives progress at that moment (inside wait/test/progress), outside internal locks, so
  // it may post new operations; it must not block. If the request is already complete the
  // callback runs at once on the calling thread. Every callback registered on a request runs
  // (on_complete and co_await alike); those registered while it is pending run in the order
  // they were registered. An exception a callback throws while progress runs it is logged
  // (error level) and dropped: it would otherwise surface in an unrelated wait, or end the
  // progress thread.
  using Callback = std::function<void(const Status& status, const Error* error)>;

  Request() = default;

  bool valid() const { return impl_ != nullptr; }
  // Drives progress once without sleeping; true when the request is complete (successfully or
  // not). Does not throw the request's error: wait() or error() tells.
  bool test();
  // Blocks until completion and returns the status, or raises the request's Error. With a
  // timeout (default: ANVIEW_TIMEOUT) raises Error(timeout) naming rank, peer, operation and
  // tag when it runs out; the request then stays pending and may be waited on again.
  Status wait(std::optional<std::chrono::milliseconds> timeout = {});
  // Cancels a receive that has not matched a message yet; true if it was cancelled (it then
  // completes with a usage Error "cancelled"). Sends and matched receives cannot be cancelled.
  bool cancel();
  // Gives up on a send or receive in any phase, so that its buffer is no longer used when this
  // returns: a receive that has not matched is cancelled; anything else fails with `reason`
  // and closes the link to its peer (the peer could still read or write the buffer), failing
  // that link's other traffic with the same cause. True when it gave up on the request; false
  // when the request had completed already (its outcome stands). A link to this rank itself
  // closes for good too (later sends to self fail). A usage Error for other requests
  // (nonblocking collectives, one-sided operations).
  bool abandon(const Error& reason);
  bool done() const;
  // The status of a completed request; the error of a failed one (null otherwise).
  Status status() const;
  const Error* error() const;
  void on_complete(Callback callback);

  // co_await request: suspends until completion, then yields the Status or throws the Error.
  // The coroutine resumes on the thread that drives progress (see Callback).
  struct Awaiter {
    Request* request;
    bool await_ready() const { return request->done(); }
    bool await_suspend(std::coroutine_handle<> handle);
    Status await_resume() const;
  };
  Awaiter operator co_await() & { return Awaiter{this}; }
  Awaiter operator co_await() && { return Awaiter{this}; }

  explicit Request(std::shared_ptr<detail::RequestImpl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<detail::RequestImpl> impl_;
};

}  // namespace anview
