#include "patterns/rpc_client.hpp"
#include "base/timeouts.hpp"

#include <algorithm>
#include <limits>

#include "base/log.hpp"
#include "patterns/connection.hpp"
#include "patterns/rpc_transfer.hpp"

namespace anview {

using patterns::rpc::Frame;
using patterns::rpc::Kind;
using patterns::rpc::ReplyStatus;
namespace rpc = patterns::rpc;

namespace detail {
namespace {

// Small replies come inline; a reply's frame always fits (max_reply_frame_bytes), so its
// error text or tensor descriptions are never cut off by the buffer.
constexpr std::size_t reply_capacity = 8192;
static_assert(reply_capacity >= rpc::max_reply_frame_bytes);
constexpr auto wait_slice = std::chrono::milliseconds(100);
constexpr int max_attempts = 3;

bool connection_kind(ErrorKind kind) {
  return kind == ErrorKind::peer_lost || kind == ErrorKind::link;
}

ErrorKind kind_of(ReplyStatus status) {
  switch (status) {
    case ReplyStatus::unknown_method:
    case ReplyStatus::handler_error:
      return ErrorKind::remote;
    case ReplyStatus::deadline_exceeded:
    case ReplyStatus::cancelled:
      return ErrorKind::timeout;
    case ReplyStatus::bad_request:
      return ErrorKind::usage;
    case ReplyStatus::shutting_down:
      return ErrorKind::peer_lost;
    case ReplyStatus::ok:
      break;
  }
  return ErrorKind::protocol;
}

void on_reply_header(const std::shared_ptr<RpcCallState>& call,
                     const std::shared_ptr<RpcConnection>& conn, std::uint64_t id,
                     const Status& status, const Error* error);

}  // namespace

void RpcCallState::finish(std::optional<Error> failure, const char* take_back_because) {
  std::vector<RpcCall::Callback> run;
  {
    std::unique_lock lock(mu);
    if (finishing) return;
    finishing = true;  // the outcome is decided: what the give-up below fails is ignored
    error = std::move(failure);
    pending.clear();
    // An attempt being issued on another thread (a retry) stores its sends first, so that the
    // give-up sees them. (issue() registers the reply's callback only after that: this thread
    // is never the one issuing.)
    cv.wait(lock, [&] { return !issuing; });
  }
  if (error && take_back_because != nullptr) {
    try {
      give_up_request(take_back_because);
    } catch (const std::exception& e) {  // raised by another call's callback run meanwhile
      base::log("rpc", base::LogLevel::error, "rpc '", method,
                "': a callback raised while the call's request was taken back: ", e.what());
    }
  }
  {
    std::lock_guard lock(mu);
    run.swap(callbacks);  // also those added during the give-up
    done.store(true, std::memory_order_release);
  }
  cv.notify_all();
  if (auto c = client.lock()) c->call_finished();
  if (error) {
    base::log("rpc", base::LogLevel::info, error->what());
    for (auto& cb : run) cb(nullptr, &*error);
  } else {
    for (auto& cb : run) cb(&reply, nullptr);
  }
}

bool RpcCallState::ending() const {
  std::lock_guard lock(mu);
  return finishing;
}

void RpcCallState::give_up_request(const std::string& why) {
  std::vector<Request> sends;
  std::shared_ptr<RpcConnection> conn;
  {
    std::lock_guard lock(mu);
    sends.swap(body_sends);
    conn = connection;
  }
  const auto unsent = [&] {
    return std::any_of(sends.begin(), sends.end(), [](Request& r) { return !r.done(); });
  };
  if (!conn || !conn->own || !unsent()) return;
  conn->comm.progress();  // a part the server took a moment ago completes here
  if (!unsent()) return;
  conn->given_up.store(true);
  conn->broken.store(true);
  const Error reason(ErrorKind::link,
                     {.peer = conn->server,
                      .peer_address = conn->name,
                      .operation = "rpc connection to " + conn->name,
                      .cause = "closed by the client: call '" + method + "' ended (" + why +
                               ") before the server took its request"});
  base::log("rpc", base::LogLevel::info, reason.what());
  for (auto& r : sends) {
    if (!r.done()) r.abandon(reason);  // the first closes the link; it fails the others
  }
}

Request RpcCallState::next_pending() {
  std::lock_guard lock(mu);
  for (auto& r : pending) {
    if (!r.done()) return r;
  }
  return {};
}

namespace {

// Receives and drops the body of a reply that came after its call ended.
void drain(RpcConnection& conn, std::uint64_t id, const Frame& frame) {
  auto sink = std::make_shared<Message>();
  for (auto& part : rpc::receive_body(conn.comm, conn.server, rpc::reply_tag(id), frame, *sink))
    part.on_complete([sink](const Status&, const Error*) {});
}

void on_reply_header(const std::shared_ptr<RpcCallState>& call,
                     const std::shared_ptr<RpcConnection>& conn, std::uint64_t id,
                     const Status& status, const Error* error) {
  auto client = call->client.lock();
  {
    std::lock_guard lock(call->mu);
    if (call->connection != conn || call->id != id) return;  // an attempt a retry replaced
    if (error && call->finishing) return;  // e.g. the failure of its own give_up_request()
  }
  if (error) {
    if (connection_kind(error->kind()) && client) {
      client->connection_failed(call, *error);
    } else if (client) {
      call->finish(client->call_error(*call, error->kind(), error->cause()));
    }
    return;
  }
  Frame frame;
  std::string why;
  const rpc::Limits limits = client ? client->limits() : rpc::Limits{};
  if (!rpc::parse({call->reply_frame.get(), status.bytes}, limits, frame, why) ||
      frame.kind != Kind::reply || frame.call_id != id) {
    if (why.empty()) why = "a frame that is not the reply of call " + std::to_string(id);
    conn->broken.store(true);  // its parts (if any) cannot be received: a new one is needed
    if (client) {
      call->finish(
          client->call_error(*call, ErrorKind::protocol, "the server sent a bad reply: " + why));
    }
    return;
  }
  if (call->ending()) {  // the call timed out meanwhile
    drain(*conn, id, frame);
    return;
  }
  if (frame.status == ReplyStatus::shutting_down && client) {  // as if the connection broke
    client->connection_failed(call,
                              Error(ErrorKind::peer_lost, {.cause = std::string(frame.text)}));
    return;
  }
  if (frame.status != ReplyStatus::ok) {
    // Refused before the server read the request's parts (too large for it): take them back.
    if (client) {
      call->finish(client->call_error(
                       *call, kind_of(frame.status),
                       std::string(rpc::to_string(frame.status)) + ": " + std::string(frame.text)),
                   frame.status == ReplyStatus::bad_request ? "request refused" : nullptr);
    }
    return;
  }
  Message reply;
  auto parts = rpc::receive_body(conn->comm, conn->server, rpc::reply_tag(id), frame, reply);
  {
    std::lock_guard lock(call->mu);
    call->reply = std::move(reply);
    call->parts_left = parts.size();
    call->pending = parts;
  }
  if (parts.empty()) {
    call->finish(std::nullopt);
    return;
  }
  for (auto& part : parts) {
    part.on_complete([call](const Status&, const Error* err) {
      if (err) {
        auto c = call->client.lock();
        if (c) call->finish(c->call_error(*call, err->kind(), err->cause()));
        return;
      }
      bool last;
      {
        std::lock_guard lock(call->mu);
        last = --call->parts_left == 0;
      }
      if (last) call->finish(std::nullopt);
    });
  }
}

}  // namespace

RpcClientImpl::RpcClientImpl(std::vector<std::string> addresses, ClientOptions options)
    : options_(options),
      limits_{.max_message_bytes = options.max_message_bytes},
      addresses_(std::move(addresses)) {
  if (addresses_.empty())
    throw Error(ErrorKind::usage, {.operation = "rpc connect", .cause = "no server address"});
  connection();  // connects now, so a wrong address is said at once
}

RpcClientImpl::RpcClientImpl(Communicator comm, int server, ClientOptions options)
    : options_(options), limits_{.max_message_bytes = options.max_message_bytes} {
  if (server < 0 || server >= comm.size() || server == comm.rank())
    throw Error(ErrorKind::usage,
                {.rank = comm.rank(),
                 .peer = server,
                 .operation = "rpc client",
                 .cause = "rank " + std::to_string(server) + " cannot be the server of rank " +
                          std::to_string(comm.rank()) + " in a communicator of " +
                          std::to_string(comm.size())});
  current_ =
      std::make_shared<RpcConnection>(std::move(comm), server, "rank " + std::to_string(server));
}

RpcClientImpl::~RpcClientImpl() {
  std::deque<std::shared_ptr<RpcCallState>> dropped;
  {
    std::lock_guard lock(retries_->mu);
    retries_->stopping = true;
    dropped.swap(retries_->calls);
  }
  retries_->cv.notify_all();
  if (retry_thread_.joinable()) {
    // Here on the retry thread itself, the thread goes on after this returns: it touches only
    // the queue it shares, finds it stopping and ends.
    if (retry_thread_.get_id() == std::this_thread::get_id()) {
      retry_thread_.detach();
    } else {
      retry_thread_.join();
    }
  }
  for (const auto& call : dropped) fail_unretried(*call);
}

void RpcClientImpl::fail_unretried(RpcCallState& call) {
  call.finish(
      Error(ErrorKind::usage, {.operation = "rpc '" + call.method + "'",
                               .cause = "the RPC client was destroyed before the call's retry"}));
}

std::shared_ptr<RpcConnection> RpcClientImpl::open(std::size_t index) {
  auto conn = std::make_shared<RpcConnection>(
      patterns::connect_to(addresses_[index], "rpc", options_.connect_timeout), 0,
      addresses_[index]);
  conn->own = true;
  return conn;
}

std::shared_ptr<RpcConnection> RpcClientImpl::connection() {
  std::lock_guard lock(mu_);
  if (current_ && (!current_->broken.load() || addresses_.empty())) return current_;
  // The first connection starts at the first address; after a failure, at the next one.
  // A connection this client closed itself (give_up_request) says nothing against its server.
  if (current_ && !current_->given_up.load())
    address_index_ = (address_index_ + 1) % addresses_.size();
  std::optional<Error> last;
  for (std::size_t tried = 0; tried < addresses_.size(); ++tried) {
    const std::size_t i = (address_index_ + tried) % addresses_.size();
    try {
      current_ = open(i);
      address_index_ = i;
      return current_;
    } catch (const Error& e) {
      last = e;
    }
  }
  throw *last;
}

std::string RpcClientImpl::server() const {
  std::lock_guard lock(mu_);
  return current_ ? current_->name : addresses_.front();
}

Error RpcClientImpl::call_error(const RpcCallState& call, ErrorKind kind,
                                const std::string& cause) const {
  std::string server;
  int peer = 0;
  {
    std::lock_guard lock(call.mu);
    if (call.connection) {
      server = call.connection->name;
      peer = call.connection->server;
    }
  }
  return Error(kind, {.peer = peer,
                      .peer_address = server,
                      .operation = "rpc '" + call.method + "' to " + server,
                      .cause = cause});
}

namespace {

// Call ids come from one counter per process: clients over one communicator (several at once,
// or one after another, with replies to a timed-out call still on the way) use the same reply
// tags, and the server keys its running calls by (peer, id). Ids wrap below max_call_id.
std::uint64_t next_call_id() {
  static std::atomic<std::uint64_t> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed) % (rpc::max_call_id - 1) + 1;
}

}  // namespace

void RpcClientImpl::issue(const std::shared_ptr<RpcCallState>& call,
                          std::shared_ptr<RpcConnection> conn) {
  const auto id = next_call_id();
  Request header;
  {
    std::lock_guard lock(call->mu);
    if (call->finishing) return;  // a retry that came after the call ended: nothing is sent
    call->issuing = true;
    call->connection = conn;
    call->id = id;
    ++call->attempts;
    // Not zeroed: a receive fills what the reply uses.
    if (!call->reply_frame)
      call->reply_frame = std::make_unique_for_overwrite<std::byte[]>(reply_capacity);
    call->parts_left = 0;
    header =
        conn->comm.irecv(call->reply_frame.get(), reply_capacity, conn->server, rpc::reply_tag(id));
    call->pending.assign(1, header);
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      call->deadline - std::chrono::steady_clock::now());
  const auto deadline_ms = static_cast<std::uint32_t>(
      std::clamp<std::int64_t>(left.count(), 1, std::numeric_limits<std::uint32_t>::max()));
  const bool inline_payload = rpc::frame_size(call->method, call->request.tensors(),
                                              call->request.size()) <= rpc::request_capacity;
  std::vector<Request> sends;
  try {
    sends = rpc::send_with_body(
        conn->comm, conn->server, rpc::request_tag, rpc::request_data_tag(id),
        rpc::encode(Kind::request, call->options.idempotent ? rpc::flag_idempotent : 0,
                    ReplyStatus::ok, id, deadline_ms, reply_capacity, call->method, call->request,
                    inline_payload),
        call->request, inline_payload);
  } catch (const Error& e) {
    // The reply's receive fails the same way (the link is down); it decides about a retry.
    base::log("rpc", base::LogLevel::debug, "request '", call->method, "' not sent: ", e.what());
  }
  {
    std::lock_guard lock(call->mu);
    call->body_sends = std::move(sends);
    call->issuing = false;
  }
  call->cv.notify_all();
  // Only now: the reply's callback may finish the call, and finish() waits for `issuing`.
  header.on_complete([call, conn, id](const Status& status, const Error* error) {
    on_reply_header(call, conn, id, status, error);
  });
}

RpcCall RpcClientImpl::call(std::string_view method, Message request, CallOptions options) {
  if (method.empty() || method.size() > rpc::max_method_bytes)
    throw Error(ErrorKind::usage, {.operation = "rpc call",
                                   .cause = "a method name has 1 to " +
                                            std::to_string(rpc::max_method_bytes) + " bytes"});
  if (request.total_bytes() > options_.max_message_bytes ||
      request.tensors().size() > rpc::max_tensors)
    throw Error(ErrorKind::usage,
                {.operation = "rpc '" + std::string(method) + "'",
                 .cause = "a request of " + std::to_string(request.total_bytes()) + " bytes and " +
                          std::to_string(request.tensors().size()) + " tensors (limits " +
                          std::to_string(options_.max_message_bytes) + " bytes, " +
                          std::to_string(rpc::max_tensors) + " tensors)"});
  for (const auto& t : request.tensors()) {
    if (t.shape.size() > rpc::max_dims)
      throw Error(ErrorKind::usage, {.operation = "rpc '" + std::string(method) + "'",
                                     .cause = "a tensor of " + std::to_string(t.shape.size()) +
                                              " dimensions (limit 8)"});
  }
  auto call = std::make_shared<RpcCallState>();
  call->client = weak_from_this();
  call->method = std::string(method);
  call->options = options;
  const auto deadline = base::timeout_or_default(
      options.deadline.count() > 0 ? options.deadline : options_.default_deadline);
  call->deadline = std::chrono::steady_clock::now() + deadline;
  call->request = std::move(request);
  pending_.fetch_add(1, std::memory_order_relaxed);
  std::shared_ptr<RpcConnection> conn;
  try {
    conn = connection();
  } catch (const Error&) {
    pending_.fetch_sub(1, std::memory_order_relaxed);
    throw;
  }
  {
    std::lock_guard lock(mu_);
    // Calls waited for by get() leave no one to prune them: done when progress() is not used.
    if (in_flight_.size() >= 64 && in_flight_.size() > 2 * pending()) prune_in_flight();
    in_flight_.push_back(call);
  }
  issue(call, std::move(conn));
  return RpcCall(call);
}

void RpcClientImpl::connection_failed(const std::shared_ptr<RpcCallState>& call,
                                      const Error& error) {
  if (call->ending()) return;  // its outcome is decided: no retry
  std::shared_ptr<RpcConnection> conn;
  {
    std::lock_guard lock(call->mu);
    conn = call->connection;
  }
  if (conn) conn->broken.store(true);
  const bool retry = call->options.idempotent && !addresses_.empty() &&
                     call->attempts < max_attempts &&
                     std::chrono::steady_clock::now() < call->deadline;
  if (!retry) {
    std::string cause = error.cause();
    if (!call->options.idempotent) cause += " (not retried: the call is not marked idempotent)";
    call->finish(call_error(*call, error.kind(), cause));
    return;
  }
  base::log("rpc", base::LogLevel::info, "rpc '", call->method, "' to ", conn ? conn->name : "",
            " failed (", error.cause(), "); retrying it on a new connection");
  std::lock_guard lock(retries_->mu);
  retries_->calls.push_back(call);
  if (!retry_thread_.joinable()) {
    retry_thread_ =
        std::thread([queue = retries_, client = weak_from_this()] { retry_loop(queue, client); });
  }
  retries_->cv.notify_one();
}

void RpcClientImpl::retry_loop(const std::shared_ptr<RetryQueue>& queue,
                               const std::weak_ptr<RpcClientImpl>& client) {
  std::unique_lock lock(queue->mu);
  for (;;) {
    queue->cv.wait(lock, [&] { return queue->stopping || !queue->calls.empty(); });
    if (queue->stopping) return;
    auto call = std::move(queue->calls.front());
    queue->calls.pop_front();
    lock.unlock();
    {
      // The client's last reference may be dropped in here (by a callback) or when `self`
      // goes: its destructor then detaches this thread, which touches only `queue` after.
      std::shared_ptr<RpcClientImpl> self = client.lock();
      if (!self) {  // being destroyed: its destructor fails the calls left queued
        fail_unretried(*call);
        return;
      }
      try {
        self->issue(call, self->connection());
      } catch (const Error& e) {
        call->finish(self->call_error(*call, e.kind(), "retry failed: " + e.cause()));
      }
      call.reset();  // its last reference may hold a connection: dropped while the client lives
    }
    lock.lock();
  }
}

void RpcClientImpl::progress() {
  std::vector<std::shared_ptr<RpcConnection>> connections;
  std::vector<std::shared_ptr<RpcCallState>> calls;
  {
    std::lock_guard lock(mu_);
    if (current_) connections.push_back(current_);
    calls = prune_in_flight();
  }
  for (const auto& call : calls) {
    std::lock_guard lock(call->mu);
    if (call->connection &&
        std::find(connections.begin(), connections.end(), call->connection) == connections.end())
      connections.push_back(call->connection);  // a call left on a connection since replaced
  }
  for (const auto& conn : connections) conn->comm.progress();
  const auto now = std::chrono::steady_clock::now();
  for (const auto& call : calls) call->expire_if_due(now);
}

std::vector<std::shared_ptr<RpcCallState>> RpcClientImpl::prune_in_flight() {
  std::vector<std::shared_ptr<RpcCallState>> live;
  std::erase_if(in_flight_, [&](const std::weak_ptr<RpcCallState>& weak) {
    auto call = weak.lock();
    if (!call || call->done.load(std::memory_order_acquire)) return true;
    live.push_back(std::move(call));
    return false;
  });
  return live;
}

bool RpcCallState::expire_if_due(std::chrono::steady_clock::time_point now) {
  if (done.load(std::memory_order_acquire) || now < deadline || ending()) return false;
  std::shared_ptr<RpcConnection> conn;
  std::uint64_t call_id;
  {
    std::lock_guard lock(mu);
    conn = connection;
    call_id = id;
  }
  if (conn) {  // tell the server to drop the call; a late reply is received and dropped
    try {
      patterns::send_owned(
          conn->comm, conn->server, rpc::request_tag,
          rpc::encode(Kind::cancel, 0, ReplyStatus::ok, call_id, 0, 0, {}, Message(), false));
    } catch (const Error&) {
    }
  }
  if (auto owner = client.lock()) {
    finish(owner->call_error(*this, ErrorKind::timeout,
                             "deadline exceeded: no reply in time; the server was told to drop "
                             "the call"),
           "deadline exceeded");
  } else {
    finish(Error(ErrorKind::timeout,
                 {.operation = "rpc '" + method + "'", .cause = "deadline exceeded"}),
           "deadline exceeded");
  }
  return true;
}

}  // namespace detail

// ---- public handles ----

Message RpcCall::get() {
  auto& call = *state_;
  while (!call.done.load(std::memory_order_acquire)) {
    const auto now = std::chrono::steady_clock::now();
    // Expired (here or by another thread): `done` comes once the request was taken back.
    if (call.expire_if_due(now)) continue;
    const auto slice =
        std::min<std::chrono::steady_clock::duration>(call.deadline - now, detail::wait_slice);
    Request r = call.next_pending();
    if (r.valid()) {
      try {
        r.wait(std::max(std::chrono::milliseconds(1),
                        std::chrono::duration_cast<std::chrono::milliseconds>(slice)));
      } catch (const Error&) {  // its callback completes the call (or retries it)
      }
      if (r.done() && !call.done.load()) std::this_thread::yield();
    } else {
      std::unique_lock lock(call.mu);
      call.cv.wait_for(lock, std::chrono::milliseconds(1), [&] { return call.done.load(); });
    }
  }
  std::lock_guard lock(call.mu);
  if (call.error) throw *call.error;
  return call.reply;
}

bool RpcCall::test() {
  if (done()) return true;
  Request r = state_->next_pending();
  if (r.valid()) r.test();
  if (!done()) state_->expire_if_due(std::chrono::steady_clock::now());
  return done();
}

bool RpcCall::done() const {
  return state_ && state_->done.load(std::memory_order_acquire);
}

void RpcCall::on_complete(Callback callback) {
  auto& call = *state_;
  {
    std::lock_guard lock(call.mu);
    if (!call.done.load()) {
      call.callbacks.push_back(std::move(callback));
      return;
    }
  }
  if (call.error) {
    callback(nullptr, &*call.error);
  } else {
    callback(&call.reply, nullptr);
  }
}

bool RpcCall::Awaiter::await_suspend(std::coroutine_handle<> handle) {
  auto& state = *call->state_;
  std::lock_guard lock(state.mu);
  if (state.done.load()) return false;
  state.callbacks.push_back([handle](const Message*, const Error*) { handle.resume(); });
  return true;
}

Message RpcCall::Awaiter::await_resume() const {
  auto& state = *call->state_;
  std::lock_guard lock(state.mu);
  if (state.error) throw *state.error;
  return state.reply;
}

RpcClient::RpcClient(std::shared_ptr<detail::RpcClientImpl> impl) : impl_(std::move(impl)) {}

RpcClient RpcClient::connect(const std::string& address, ClientOptions options) {
  return connect(std::vector<std::string>{address}, options);
}

RpcClient RpcClient::connect(std::vector<std::string> addresses, ClientOptions options) {
  return RpcClient(std::make_shared<detail::RpcClientImpl>(std::move(addresses), options));
}

RpcClient RpcClient::over(Communicator comm, int server, ClientOptions options) {
  return RpcClient(std::make_shared<detail::RpcClientImpl>(std::move(comm), server, options));
}

RpcCall RpcClient::call(std::string_view method, Message request, CallOptions options) {
  return impl_->call(method, std::move(request), options);
}
void RpcClient::progress() {
  impl_->progress();
}
std::string RpcClient::server() const {
  return impl_->server();
}
std::size_t RpcClient::pending() const {
  return impl_->pending();
}

}  // namespace anview
