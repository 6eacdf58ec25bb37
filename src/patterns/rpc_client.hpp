// The client side of RPC: connections to a server, and the state of each call.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <coroutine>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "anview/rpc.hpp"
#include "patterns/rpc_frame.hpp"

namespace anview::detail {

class RpcClientImpl;

// One connection (or a communicator with the server in it).
struct RpcConnection {
  RpcConnection(Communicator c, int server_rank, std::string server_name)
      : comm(std::move(c)), server(server_rank), name(std::move(server_name)) {}
  Communicator comm;
  int server = 0;
  std::string name;  // "127.0.0.1:7000", "rank 0"
  // This client's own connection (a communicator of two), not a shared communicator: it may be
  // closed to take back a request the server has not taken (RpcCallState::give_up_request).
  bool own = false;
  std::atomic<bool> broken{false};
  std::atomic<bool> given_up{false};  // broken by this client (give_up_request), not the server
};

struct RpcCallState : std::enable_shared_from_this<RpcCallState> {
  std::weak_ptr<RpcClientImpl> client;
  std::string method;
  CallOptions options;
  std::chrono::steady_clock::time_point deadline;
  Message request;  // kept alive until the call completes
  int attempts = 0;

  mutable std::mutex mu;  // guards everything below
  std::condition_variable cv;
  std::shared_ptr<RpcConnection> connection;
  std::uint64_t id = 0;
  std::unique_ptr<std::byte[]> reply_frame;  // the first reply message lands here
  std::vector<Request> pending;              // what the reply still needs
  std::vector<Request> body_sends;           // the request's parts as sent by the last attempt
  std::size_t parts_left = 0;
  Message reply;
  std::optional<Error> error;
  bool finishing = false;  // finish() has begun: the outcome is decided
  bool issuing = false;    // issue() is posting an attempt's sends (cv tells when it is done)
  std::atomic<bool> done{false};
  std::vector<RpcCall::Callback> callbacks;

  // Completes the call (once) and runs the callbacks. A failure with `take_back_because` first
  // takes back the request's parts the server has not taken (give_up_request), so that its
  // memory is free when the call is seen done.
  void finish(std::optional<Error> failure, const char* take_back_because = nullptr);
  // finish() has begun.
  bool ending() const;
  // Past its deadline and not complete: tells the server to drop it and fails it with a
  // timeout. True when it did.
  bool expire_if_due(std::chrono::steady_clock::time_point now);
  // The call ends before the server took its request: parts of it still being sent are
  // abandoned, closing this client's own connection, so that the request's memory is free when
  // the call completes (the server would read it later). Calls still in flight on that
  // connection fail as on a lost connection (idempotent ones are retried). Over a shared
  // communicator nothing is closed (rpc.hpp).
  void give_up_request(const std::string& why);
  // The first receive the reply still waits for (invalid when there is none).
  Request next_pending();
};

class RpcClientImpl : public std::enable_shared_from_this<RpcClientImpl> {
 public:
  RpcClientImpl(std::vector<std::string> addresses, ClientOptions options);
  RpcClientImpl(Communicator comm, int server, ClientOptions options);
  ~RpcClientImpl();

  RpcCall call(std::string_view method, Message request, CallOptions options);
  void progress();
  std::string server() const;
  std::size_t pending() const { return pending_.load(std::memory_order_relaxed); }

  // A call's connection failed: retried (idempotent, time left) or failed.
  void connection_failed(const std::shared_ptr<RpcCallState>& call, const Error& error);
  void call_finished() { pending_.fetch_sub(1, std::memory_order_relaxed); }
  // The Error a call fails with: kind and cause of `error`, the method and the server.
  Error call_error(const RpcCallState& call, ErrorKind kind, const std::string& cause) const;
  const patterns::rpc::Limits& limits() const { return limits_; }

 private:
  // The current connection, (re)connecting when there is none or it broke.
  std::shared_ptr<RpcConnection> connection();
  std::shared_ptr<RpcConnection> open(std::size_t address_index);
  // Sends the call's request on `connection` with a new id, the reply's receive posted first.
  void issue(const std::shared_ptr<RpcCallState>& call, std::shared_ptr<RpcConnection> connection);
  // The retry thread's state, shared with it: the thread may outlive the client, whose last
  // handle may go away on that very thread (a callback run by a failed retry holds it). The
  // thread holds the client while a retry is under way: a client whose last handle goes then
  // is destroyed when that retry ends (at most its connect timeout later), on that thread.
  struct RetryQueue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::shared_ptr<RpcCallState>> calls;
    bool stopping = false;
  };
  static void retry_loop(const std::shared_ptr<RetryQueue>& queue,
                         const std::weak_ptr<RpcClientImpl>& client);
  // A queued retry the client goes away before: the call fails (usage, naming why).
  static void fail_unretried(RpcCallState& call);

  ClientOptions options_;
  patterns::rpc::Limits limits_;
  std::vector<std::string> addresses_;  // empty over a communicator
  mutable std::mutex mu_;
  std::shared_ptr<RpcConnection> current_;
  // Calls issued and perhaps not complete (mu_): progress() drives their connections and
  // expires those past their deadline, for callers that wait by test(), on_complete or co_await.
  std::vector<std::weak_ptr<RpcCallState>> in_flight_;
  // mu_ held: drops the calls of in_flight_ that completed or went away; returns the others.
  std::vector<std::shared_ptr<RpcCallState>> prune_in_flight();
  std::size_t address_index_ = 0;
  std::atomic<std::size_t> pending_{0};

  std::shared_ptr<RetryQueue> retries_ = std::make_shared<RetryQueue>();
  std::thread retry_thread_;  // started on the first retry (under retries_->mu)
};

}  // namespace anview::detail
