#include "patterns/rpc_server.hpp"
#include "base/timeouts.hpp"

#include <cstdlib>
#include <cstring>
#include <exception>
#include <utility>
#include <vector>

#include "base/log.hpp"
#include "patterns/rpc_transfer.hpp"

namespace anview {

using patterns::rpc::Frame;
using patterns::rpc::Kind;
using patterns::rpc::ReplyStatus;
namespace rpc = patterns::rpc;

namespace detail {

using rpc::receive_body;
using rpc::send_with_body;

std::string RpcEndpoint::peer_name(int peer) const {
  if (source == any_source) return "rank " + std::to_string(peer);
  return "connection " + std::to_string(connection);
}

namespace {

// The server whose connection thread, communicator thread or handler job this is.
thread_local const RpcServerImpl* serving_for = nullptr;
struct ServingFor {
  explicit ServingFor(const RpcServerImpl* server) : previous(serving_for) { serving_for = server; }
  ~ServingFor() { serving_for = previous; }
  ServingFor(const ServingFor&) = delete;
  ServingFor& operator=(const ServingFor&) = delete;
  const RpcServerImpl* previous;
};

// What makes a handler's reply one the client would refuse (its frame is checked against the
// same limits as a request's), or empty.
std::string reply_problem(const Message& reply) {
  if (reply.tensors().size() > rpc::max_tensors)
    return std::to_string(reply.tensors().size()) + " tensors (limit " +
           std::to_string(rpc::max_tensors) + ")";
  for (const auto& t : reply.tensors())
    if (t.shape.size() > rpc::max_dims)
      return "a tensor of " + std::to_string(t.shape.size()) + " dimensions (limit " +
             std::to_string(rpc::max_dims) + ")";
  return {};
}

}  // namespace

void RpcServerCall::answer(ReplyStatus status, std::string_view text, const Message* reply) {
  if (status == ReplyStatus::ok && reply != nullptr) {
    if (const std::string problem = reply_problem(*reply); !problem.empty()) {
      answer(ReplyStatus::handler_error, "the handler of '" + method + "' replied with " + problem,
             nullptr);
      return;
    }
  }
  if (answered.exchange(true, std::memory_order_acq_rel)) return;
  {
    std::lock_guard lock(endpoint->mu);
    endpoint->running.erase({peer, id});
  }
  Message body = status == ReplyStatus::ok && reply ? *reply : Message();
  if (status == ReplyStatus::ok && cancelled.load(std::memory_order_acquire)) {
    status = ReplyStatus::cancelled;  // the client gave up: no need to send the body
    body = Message();
  }
  if (text.size() > rpc::max_error_bytes) text = text.substr(0, rpc::max_error_bytes);
  const bool inline_payload = rpc::frame_size(text, body.tensors(), body.size()) <= reply_capacity;
  try {
    send_with_body(endpoint->comm, peer, rpc::reply_tag(id), rpc::reply_tag(id),
                   rpc::encode(Kind::reply, 0, status, id, 0, 0, text, body, inline_payload), body,
                   inline_payload);
  } catch (const Error& e) {
    // The connection failed; its thread reports that.
    base::log("rpc", base::LogLevel::debug, "reply to call ", id, " of ", endpoint->peer_name(peer),
              " not sent: ", e.what());
  }
}

RpcServerCall::~RpcServerCall() {
  if (!answered.load(std::memory_order_acquire))
    answer(ReplyStatus::handler_error, "the handler of '" + method + "' did not reply", nullptr);
}

RpcServerImpl::RpcServerImpl(ServerOptions options)
    : options_(options),
      limits_{.max_message_bytes = options.max_message_bytes},
      timeout_(base::timeout_or_default(options.connect_timeout)) {
  if (options_.handler_threads < 0)
    throw Error(ErrorKind::usage,
                {.operation = "rpc server",
                 .cause = "handler_threads is " + std::to_string(options_.handler_threads)});
  if (options_.handler_threads > 0)
    pool_ = std::make_unique<patterns::HandlerPool>(options_.handler_threads);
}

RpcServerImpl::~RpcServerImpl() {
  shutdown();
}

void RpcServerImpl::listen(const std::string& host_port) {
  // The listener's threads call back into this object; shutdown() stops them first.
  listener_ = std::make_unique<patterns::Listener>(
      host_port, "rpc", timeout_, [this](Communicator comm, std::uint64_t id) {
        serve_endpoint(std::make_shared<RpcEndpoint>(std::move(comm), 1, id));
      });
}

void RpcServerImpl::serve(Communicator comm) {
  auto endpoint = std::make_shared<RpcEndpoint>(std::move(comm), any_source, 0);
  comm_thread_ = std::thread([this, endpoint] {
    try {
      serve_endpoint(endpoint);
    } catch (const std::exception& e) {
      base::log("rpc", base::LogLevel::error, "rpc server on rank ", endpoint->comm.rank(),
                " stops: ", e.what());
    }
  });
}

void RpcServerImpl::add_method(std::string name, RpcServer::Handler sync,
                               RpcServer::AsyncHandler async) {
  if (name.empty() || name.size() > rpc::max_method_bytes)
    throw Error(ErrorKind::usage, {.operation = "rpc add_method",
                                   .cause = "a method name has 1 to " +
                                            std::to_string(rpc::max_method_bytes) + " bytes"});
  std::unique_lock lock(methods_mu_);
  methods_[std::move(name)] = Method{std::move(sync), std::move(async)};
}

void RpcServerImpl::shutdown() {
  stopping_.store(true, std::memory_order_release);
  if (listener_) listener_->request_stop();
  // A handler, or a connection's thread, cannot wait for the threads it runs on: it only says
  // stop. The joins come with the next shutdown() from another thread, at the latest with the
  // destructor.
  if (serving_for == this) return;
  std::lock_guard lock(shutdown_mu_);
  if (std::exchange(joined_, true)) return;
  if (listener_) listener_->stop();  // joins the connection threads
  if (comm_thread_.joinable()) comm_thread_.join();
  pool_.reset();  // runs the handlers already queued; they answer
}

void RpcServerImpl::fail_running(RpcEndpoint& endpoint) {
  std::vector<std::shared_ptr<RpcServerCall>> calls;
  {
    std::lock_guard lock(endpoint.mu);
    for (auto& [key, weak] : endpoint.running) {
      if (auto call = weak.lock()) calls.push_back(std::move(call));
    }
  }
  for (auto& call : calls)
    call->answer(ReplyStatus::shutting_down, "the server is shutting down", nullptr);
}

void RpcServerImpl::serve_endpoint(const std::shared_ptr<RpcEndpoint>& endpoint) {
  const ServingFor serving(this);
  serve_requests(endpoint);
  // However the loop ended while the server stops, the calls still running are failed (an
  // asynchronous handler may hold its Responder): their callers learn it now.
  if (stopping_.load(std::memory_order_acquire)) fail_running(*endpoint);
}

void RpcServerImpl::serve_requests(const std::shared_ptr<RpcEndpoint>& endpoint) {
  std::vector<std::byte> buffer(rpc::request_capacity);
  while (!stopping_.load(std::memory_order_acquire)) {
    Request r =
        endpoint->comm.irecv(buffer.data(), buffer.size(), endpoint->source, rpc::request_tag);
    try {
      if (!patterns::wait_unless_stopping(r, stopping_)) {
        patterns::cancel_or_finish(r);  // `buffer` goes away when this returns
        fail_running(*endpoint);
        return;
      }
    } catch (const Error& e) {
      if (endpoint->source != any_source) {
        base::log("rpc", base::LogLevel::debug, endpoint->peer_name(1), " closed: ", e.what());
        return;  // the client left or its link broke
      }
      if (e.kind() == ErrorKind::usage) {  // a request larger than the buffer: said by p2p
        base::log("rpc", base::LogLevel::error, "rpc server on rank ", endpoint->comm.rank(),
                  " dropped a request: ", e.what());
        continue;
      }
      if (e.peer() >= 0) continue;  // one client rank failed; the others go on
      throw;
    }
    const Status status = r.status();
    if (!handle_frame(endpoint, status.source, {buffer.data(), status.bytes})) return;
  }
}

bool RpcServerImpl::handle_frame(const std::shared_ptr<RpcEndpoint>& endpoint, int peer,
                                 std::span<const std::byte> bytes) {
  Frame frame;
  std::string why;
  if (!rpc::parse(bytes, limits_, frame, why) || frame.kind == Kind::reply) {
    if (why.empty()) why = "a reply frame sent to a server";
    base::log("rpc", base::LogLevel::error, "rpc server: ", endpoint->peer_name(peer),
              " sent a bad request (", why, ")",
              endpoint->source == any_source ? "; dropped" : "; connection closed");
    // A request refused for its size is answered, so the caller learns why at once.
    if (frame.kind == Kind::request && frame.call_id > 0) {
      RpcServerCall refused;
      refused.endpoint = endpoint;
      refused.peer = peer;
      refused.id = frame.call_id;
      refused.answer(ReplyStatus::bad_request, why, nullptr);
    }
    return endpoint->source == any_source;
  }
  if (frame.kind == Kind::cancel) {
    std::lock_guard lock(endpoint->mu);
    auto it = endpoint->running.find({peer, frame.call_id});
    if (it != endpoint->running.end()) {
      if (auto call = it->second.lock()) call->cancelled.store(true, std::memory_order_release);
    }
    return true;
  }
  auto call = std::make_shared<RpcServerCall>();
  call->endpoint = endpoint;
  call->peer = peer;
  call->id = frame.call_id;
  call->method = std::string(frame.text);
  call->reply_capacity = frame.reply_capacity;
  call->deadline = frame.deadline_ms > 0 ? std::chrono::steady_clock::now() +
                                               std::chrono::milliseconds(frame.deadline_ms)
                                         : std::chrono::steady_clock::time_point::max();
  auto request = std::make_shared<Message>();
  auto parts =
      receive_body(endpoint->comm, peer, rpc::request_data_tag(frame.call_id), frame, *request);
  for (auto& part : parts) {
    try {
      part.wait(timeout_);
    } catch (const Error& e) {
      // The client failed mid-request (or sent parts that do not fit): nobody to answer. The
      // parts still posted may land later: those not started are cancelled, the others keep
      // the request's buffers alive until they end.
      for (auto& rest : parts) {
        if (!rest.cancel()) rest.on_complete([request](const Status&, const Error*) {});
      }
      call->answered.store(true);
      base::log("rpc", base::LogLevel::info, "request '", call->method, "' of ",
                endpoint->peer_name(peer), " not received: ", e.what());
      return endpoint->source == any_source && e.kind() != ErrorKind::usage;
    }
  }
  // A request that came as the server began to stop (a handler may stop it) is refused, not
  // run: shutdown() promises to fail the calls not yet answered.
  if (stopping_.load(std::memory_order_acquire)) {
    call->answer(ReplyStatus::shutting_down, "the server is shutting down", nullptr);
    return false;
  }
  {
    std::lock_guard lock(endpoint->mu);
    endpoint->running[{peer, call->id}] = call;
  }
  dispatch(std::move(call), std::move(*request));
  return true;
}

void RpcServerImpl::dispatch(std::shared_ptr<RpcServerCall> call, Message request) {
  Method method;
  {
    std::shared_lock lock(methods_mu_);
    auto it = methods_.find(call->method);
    if (it != methods_.end()) method = it->second;
  }
  if (!method.sync && !method.async) {
    call->answer(ReplyStatus::unknown_method, "no method '" + call->method + "' on this server",
                 nullptr);
    return;
  }
  auto job = [this, call = std::move(call), request = std::move(request),
              method = std::move(method)]() mutable {
    const ServingFor serving(this);  // on the pool too: a handler's shutdown() must not join it
    // The user's closures go with this scope, inside `serving`: one may hold the last handle.
    const Method handlers = std::exchange(method, {});
    if (std::chrono::steady_clock::now() >= call->deadline) {
      call->answer(ReplyStatus::deadline_exceeded, "the deadline passed before the handler ran",
                   nullptr);
      return;
    }
    const CallContext context(call);
    try {
      if (handlers.sync) {
        const Message reply = handlers.sync(context, request);
        call->answer(ReplyStatus::ok, {}, &reply);
      } else {
        handlers.async(context, request, Responder(call));
      }
    } catch (const std::exception& e) {
      call->answer(ReplyStatus::handler_error, e.what(), nullptr);
    } catch (...) {
      call->answer(ReplyStatus::handler_error, "the handler raised a non-standard exception",
                   nullptr);
    }
  };
  if (pool_) {
    pool_->post(std::move(job));
  } else {
    job();
  }
}

}  // namespace detail

// ---- public handles ----

std::string_view CallContext::method() const {
  return call_->method;
}
std::string CallContext::peer() const {
  return call_->endpoint->peer_name(call_->peer);
}
std::chrono::steady_clock::time_point CallContext::deadline() const {
  return call_->deadline;
}
bool CallContext::cancelled() const {
  return call_->cancelled.load(std::memory_order_acquire);
}

void Responder::reply(Message reply) {
  if (call_) call_->answer(ReplyStatus::ok, {}, &reply);
}
void Responder::fail(std::string message) {
  if (call_) call_->answer(ReplyStatus::handler_error, message, nullptr);
}

namespace {

// Frees the servers whose last handle went inside one of their own handlers, each on a thread
// of its own (it joins the server's threads, the handler's once that returns). At exit it waits
// for them: a "quit" handler drops the server, main returns, and the teardown (connections
// said goodbye to, threads joined) still ends before the process does.
// - Never destroyed: a server may be dropped at any time, static destruction included.
// - The wait is an exit hook registered with each server handed over: registered after every
//   static that server's teardown uses was built, it runs before they are destroyed.
// - An exit from one of a server's own threads does not wait (the teardown may be joining that
//   very thread); what is still being freed then is left to the process's end.
class Reaper {
 public:
  static Reaper& instance() {
    static Reaper* const reaper = new Reaper;
    return *reaper;
  }
  void free_later(detail::RpcServerImpl* server) noexcept {
    std::lock_guard lock(mu_);
    std::erase_if(freeing_, [](Freeing& f) {
      if (!f.done->load(std::memory_order_acquire)) return false;
      f.thread.join();
      return true;
    });
    try {
      freeing_.reserve(freeing_.size() + 1);  // no throw once the thread runs
      auto done = std::make_shared<std::atomic<bool>>(false);
      std::thread thread([server, done] {
        delete server;
        done->store(true, std::memory_order_release);
      });
      if (exited_ || std::atexit([] { instance().wait_at_exit(); }) != 0) {
        thread.detach();
        return;
      }
      freeing_.push_back(Freeing{std::move(thread), std::move(done)});
    } catch (const std::exception& e) {
      base::log("rpc", base::LogLevel::error,
                "rpc: cannot start the thread that frees a server dropped inside its own "
                "handler (",
                e.what(), "): the server stays allocated");
    }
  }

 private:
  Reaper() = default;
  void wait_at_exit() {
    std::vector<Freeing> freeing;
    {
      std::lock_guard lock(mu_);
      exited_ = true;
      freeing.swap(freeing_);
    }
    for (Freeing& f : freeing) {
      if (detail::serving_for != nullptr) {
        f.thread.detach();
      } else {
        f.thread.join();
      }
    }
  }
  struct Freeing {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::mutex mu_;
  std::vector<Freeing> freeing_;
  bool exited_ = false;  // the exit hooks ran: later servers are freed detached
};

// The last handle may go inside one of the server's own handlers (a "quit" method that drops
// it), on a thread the server must join: there the server only says stop, and the Reaper frees
// it.
std::shared_ptr<detail::RpcServerImpl> make_server(ServerOptions options) {
  using detail::RpcServerImpl;
  return std::shared_ptr<RpcServerImpl>(new RpcServerImpl(options), [](RpcServerImpl* server) {
    if (detail::serving_for != server) {
      delete server;
      return;
    }
    server->shutdown();
    Reaper::instance().free_later(server);
  });
}

}  // namespace

RpcServer::RpcServer(std::shared_ptr<detail::RpcServerImpl> impl) : impl_(std::move(impl)) {}

RpcServer RpcServer::listen(const std::string& host_port, ServerOptions options) {
  auto impl = make_server(options);
  impl->listen(host_port);
  return RpcServer(std::move(impl));
}

RpcServer RpcServer::serve(Communicator comm, ServerOptions options) {
  auto impl = make_server(options);
  impl->serve(std::move(comm));
  return RpcServer(std::move(impl));
}

void RpcServer::add_method(std::string name, Handler handler) {
  impl_->add_method(std::move(name), std::move(handler), nullptr);
}
void RpcServer::add_async_method(std::string name, AsyncHandler handler) {
  impl_->add_method(std::move(name), nullptr, std::move(handler));
}
std::string RpcServer::address() const {
  return impl_->address();
}
void RpcServer::shutdown() {
  impl_->shutdown();
}

}  // namespace anview
