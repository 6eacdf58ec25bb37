#include "anview/request.hpp"

#include "p2p/messenger.hpp"

namespace anview {
namespace {

detail::RequestImpl& checked(const std::shared_ptr<detail::RequestImpl>& impl, const char* what) {
  if (!impl) {
    throw Error(ErrorKind::usage, {.operation = what, .cause = "empty Request handle"});
  }
  return *impl;
}

}  // namespace

bool Request::test() {
  auto& r = checked(impl_, "test");
  return r.owner->test(r);
}

Status Request::wait(std::optional<std::chrono::milliseconds> timeout) {
  auto& r = checked(impl_, "wait");
  return r.owner->wait(r, timeout.value_or(r.owner->default_timeout()));
}

bool Request::cancel() {
  auto& r = checked(impl_, "cancel");
  return r.owner->cancel(impl_);
}

bool Request::abandon(const Error& reason) {
  auto& r = checked(impl_, "abandon");
  if (r.kind != detail::RequestImpl::Kind::send && r.kind != detail::RequestImpl::Kind::recv)
    throw Error(ErrorKind::usage,
                {.operation = "abandon", .cause = "only sends and receives can be abandoned"});
  return r.owner->abandon(impl_, reason);
}

bool Request::done() const {
  return checked(impl_, "done").done.load(std::memory_order_acquire);
}

Status Request::status() const {
  auto& r = checked(impl_, "status");
  if (!r.done.load(std::memory_order_acquire))
    throw Error(ErrorKind::usage, {.operation = "status", .cause = "the request is not complete"});
  return r.status;
}

const Error* Request::error() const {
  auto& r = checked(impl_, "error");
  if (!r.done.load(std::memory_order_acquire)) return nullptr;
  return r.error ? &*r.error : nullptr;
}

void Request::on_complete(Callback callback) {
  auto& r = checked(impl_, "on_complete");
  r.owner->on_complete(r, std::move(callback));
}

bool Request::Awaiter::await_suspend(std::coroutine_handle<> handle) {
  auto& r = checked(request->impl_, "co_await");
  return r.owner->on_complete_if_pending(
      r, [handle](const Status&, const Error*) { handle.resume(); });
}

Status Request::Awaiter::await_resume() const {
  auto& r = checked(request->impl_, "co_await");
  if (r.error) throw *r.error;
  return r.status;
}

}  // namespace anview
