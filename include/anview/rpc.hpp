// anview::RpcServer / RpcClient — remote procedure calls over Anview's transports.
//
// Roles as in gRPC: a server listens on an address and registers handlers by method name; a
// client connects by address and calls with a deadline. Each client connection is a private
// two-rank communicator, so its transport is chosen as for point-to-point (shared memory on
// one host, TCP across hosts) and everything p2p offers (rendezvous straight into the
// receiving buffer, several streams, TLS, the job secret) applies. Inside a job, a server can
// also serve the other ranks of a Communicator (RpcServer::serve, RpcClient::over).
//
// Many calls may be in flight on one connection; replies are matched by call id. Handlers run
// on the connection's own thread or on a pool (ServerOptions::handler_threads). Register the
// methods right after listen(): a call that comes before its method fails as unknown. The wire
// framing is in docs/rpc.md.
//
// Failures are anview::Error naming the method and the server:
//   unknown method, a handler's exception  -> ErrorKind::remote, with the handler's message;
//   the deadline passing                   -> ErrorKind::timeout (the server is told to drop
//                                             the call);
//   the server gone or unreachable         -> ErrorKind::peer_lost / link.
// A call marked idempotent is retried on a new connection (to the next address, where the
// client has several) while its deadline allows; other calls are never retried.
#pragma once

#include <chrono>
#include <coroutine>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "anview/communicator.hpp"
#include "anview/error.hpp"
#include "anview/message.hpp"

namespace anview {

namespace detail {
class RpcServerImpl;
class RpcClientImpl;
struct RpcCallState;
struct RpcServerCall;
}  // namespace detail

struct ServerOptions {
  // Threads running handlers. 0: each handler runs on the thread of the connection it came
  // from, as soon as its request is read (the fastest for short handlers: no hand-off; a slow
  // handler delays that connection's later calls, and cannot see cancelled() turn true). N > 0:
  // a pool of N threads, for handlers that block or take long.
  int handler_threads = 0;
  // The largest request (bytes plus attachments) accepted; a larger one fails that call.
  std::size_t max_message_bytes = std::size_t{1} << 30;
  // How long a connecting client may take to set up its connection. Zero: ANVIEW_TIMEOUT.
  std::chrono::milliseconds connect_timeout{0};
};

// What a handler knows about the call it serves.
class CallContext {
 public:
  std::string_view method() const;
  // The client: "rank 3" inside a communicator, "connection 7" for one that came by address.
  std::string peer() const;
  std::chrono::steady_clock::time_point deadline() const;
  // True once the client has given up on the call (deadline, cancel): a long handler may stop.
  bool cancelled() const;

  explicit CallContext(std::shared_ptr<detail::RpcServerCall> call) : call_(std::move(call)) {}

 private:
  std::shared_ptr<detail::RpcServerCall> call_;
};

// Answers one call later (for handlers that must wait for something, such as a parameter
// server's synchronous pull). Exactly one of reply/fail takes effect; dropping a Responder
// unanswered fails the call with "the handler did not reply".
class Responder {
 public:
  Responder() = default;
  void reply(Message reply);
  void fail(std::string message);

  explicit Responder(std::shared_ptr<detail::RpcServerCall> call) : call_(std::move(call)) {}

 private:
  std::shared_ptr<detail::RpcServerCall> call_;
};

class RpcServer {
 public:
  // A handler returns the reply or throws (the client gets ErrorKind::remote with what()).
  using Handler = std::function<Message(const CallContext& context, const Message& request)>;
  using AsyncHandler =
      std::function<void(const CallContext& context, const Message& request, Responder reply)>;

  // Listens on `host_port` ("0.0.0.0:7000"; port 0 picks a free one, see address()).
  static RpcServer listen(const std::string& host_port, ServerOptions options = {});
  // Serves the other ranks of `comm` (they call RpcClient::over(comm, comm.rank() here)). Give
  // RPC a communicator of its own (comm.split) when the ranks also exchange other messages:
  // RPC uses tags 1 and up.
  static RpcServer serve(Communicator comm, ServerOptions options = {});

  // Registers a method (replacing one of the same name). Safe while serving.
  void add_method(std::string name, Handler handler);
  void add_async_method(std::string name, AsyncHandler handler);

  // Where clients connect ("127.0.0.1:7000"); empty for a server over a communicator.
  std::string address() const;
  // Stops accepting, fails the calls not yet answered, closes the connections. Also done by
  // the destructor of the last handle. A handler may call it: the server then stops without
  // waiting for its own threads, which the destructor (or a shutdown() from another thread)
  // joins. The last handle may go away inside a handler too: the server then stops, and a
  // thread of the library's own joins the server's threads (the handler's once it returns) and
  // frees it. Until then, handlers already running or queued still run (what they use must
  // outlive them); a program that exits meanwhile (not from one of the server's threads) waits
  // for that teardown to end.
  void shutdown();

 private:
  explicit RpcServer(std::shared_ptr<detail::RpcServerImpl> impl);
  std::shared_ptr<detail::RpcServerImpl> impl_;
};

struct ClientOptions {
  // How long connecting may take. Zero: ANVIEW_TIMEOUT.
  std::chrono::milliseconds connect_timeout{0};
  // The deadline of a call that names none. Zero: ANVIEW_TIMEOUT.
  std::chrono::milliseconds default_deadline{0};
  std::size_t max_message_bytes = std::size_t{1} << 30;
};

struct CallOptions {
  // Zero: the client's default_deadline.
  std::chrono::milliseconds deadline{0};
  // Safe to run twice: retried on a new connection when the connection fails.
  bool idempotent = false;
};

// One call in flight. Copies share it.
class RpcCall {
 public:
  using Callback = std::function<void(const Message* reply, const Error* error)>;

  RpcCall() = default;
  // Waits for the reply (driving progress), or raises the call's Error.
  Message get();
  // Drives progress once; true when the call is complete.
  bool test();
  bool done() const;
  // Runs once on completion, on the thread that drives progress then (get, test,
  // RpcClient::progress), or at once if the call is complete.
  void on_complete(Callback callback);

  struct Awaiter {
    RpcCall* call;
    bool await_ready() const { return call->done(); }
    bool await_suspend(std::coroutine_handle<> handle);
    Message await_resume() const;
  };
  Awaiter operator co_await() & { return Awaiter{this}; }
  Awaiter operator co_await() && { return Awaiter{this}; }

  explicit RpcCall(std::shared_ptr<detail::RpcCallState> state) : state_(std::move(state)) {}

 private:
  std::shared_ptr<detail::RpcCallState> state_;
};

class RpcClient {
 public:
  // Connects to a server listening at `address` (host:port).
  static RpcClient connect(const std::string& address, ClientOptions options = {});
  // Several servers of the same service: calls go to the first that answers; an idempotent
  // call whose connection fails is retried on the next.
  static RpcClient connect(std::vector<std::string> addresses, ClientOptions options = {});
  // Calls rank `server` of `comm`, which runs RpcServer::serve(comm).
  static RpcClient over(Communicator comm, int server, ClientOptions options = {});

  // Starts a call. The request's memory must stay valid until the call completes. A call that
  // ends before the server took its request (its deadline passed while the server was busy, or
  // the server refused it) closes its connection, so that this holds: calls still in flight on
  // that connection fail as on a lost connection (idempotent ones are retried), and the next
  // call connects again. A client over() a shared communicator closes nothing: there, memory
  // given as a view may still be read after such a call failed, until the server takes the
  // request; keep it alive with Message::keep_alive.
  RpcCall call(std::string_view method, Message request, CallOptions options = {});
  // Starts a call and waits for its reply.
  Message call_sync(std::string_view method, Message request, CallOptions options = {}) {
    return call(method, std::move(request), options).get();
  }
  // Drives progress once (completes calls whose replies arrived, runs their callbacks).
  void progress();
  // The server this client talks to now ("127.0.0.1:7000", "rank 0").
  std::string server() const;
  // Calls sent and not yet complete.
  std::size_t pending() const;

 private:
  explicit RpcClient(std::shared_ptr<detail::RpcClientImpl> impl);
  std::shared_ptr<detail::RpcClientImpl> impl_;
};

}  // namespace anview
