// The server side of RPC: endpoints (a connection, or a communicator whose other ranks call),
// the calls being served, and the server that reads requests and runs handlers.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "anview/rpc.hpp"
#include "patterns/connection.hpp"
#include "patterns/handler_pool.hpp"
#include "patterns/rpc_frame.hpp"

namespace anview::detail {

// Where requests come from: one client's connection, or every other rank of a communicator.
struct RpcEndpoint {
  RpcEndpoint(Communicator c, int from, std::uint64_t number)
      : comm(std::move(c)), source(from), connection(number) {}
  Communicator comm;
  int source;                    // 1 on a connection, any_source on a communicator
  std::uint64_t connection = 0;  // its number, on a connection
  std::string peer_name(int peer) const;

  std::mutex mu;  // guards running
  std::map<std::pair<int, std::uint64_t>, std::weak_ptr<RpcServerCall>> running;
};

struct RpcServerCall {
  std::shared_ptr<RpcEndpoint> endpoint;
  int peer = -1;
  std::uint64_t id = 0;
  std::string method;
  std::chrono::steady_clock::time_point deadline;
  std::uint32_t reply_capacity = 0;
  std::atomic<bool> cancelled{false};
  std::atomic<bool> answered{false};

  // Sends the reply (once; later answers are ignored). `reply` only with ReplyStatus::ok.
  void answer(patterns::rpc::ReplyStatus status, std::string_view text, const Message* reply);
  ~RpcServerCall();  // an unanswered call fails: "the handler did not reply"
};

class RpcServerImpl : public std::enable_shared_from_this<RpcServerImpl> {
 public:
  explicit RpcServerImpl(ServerOptions options);
  ~RpcServerImpl();

  void listen(const std::string& host_port);
  void serve(Communicator comm);
  void add_method(std::string name, RpcServer::Handler sync, RpcServer::AsyncHandler async);
  std::string address() const { return listener_ ? listener_->address() : std::string(); }
  void shutdown();

 private:
  struct Method {
    RpcServer::Handler sync;
    RpcServer::AsyncHandler async;
  };
  // Reads requests from `endpoint` until it closes or the server stops.
  void serve_endpoint(const std::shared_ptr<RpcEndpoint>& endpoint);
  void serve_requests(const std::shared_ptr<RpcEndpoint>& endpoint);  // serve_endpoint's loop
  // False when the endpoint must close (a private connection that broke the protocol).
  bool handle_frame(const std::shared_ptr<RpcEndpoint>& endpoint, int peer,
                    std::span<const std::byte> bytes);
  void dispatch(std::shared_ptr<RpcServerCall> call, Message request);
  // Answers the calls `endpoint` still runs: "the server is shutting down".
  void fail_running(RpcEndpoint& endpoint);

  ServerOptions options_;
  patterns::rpc::Limits limits_;
  std::chrono::milliseconds timeout_;
  std::atomic<bool> stopping_{false};
  std::mutex shutdown_mu_;  // held while shutdown() joins the threads
  bool joined_ = false;
  mutable std::shared_mutex methods_mu_;
  std::unordered_map<std::string, Method> methods_;
  std::unique_ptr<patterns::HandlerPool> pool_;
  std::unique_ptr<patterns::Listener> listener_;
  std::thread comm_thread_;
};

}  // namespace anview::detail
