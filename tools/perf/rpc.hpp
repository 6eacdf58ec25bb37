// anview-perf rpc: echo calls from rank 1 (the client) to an RpcServer on rank 0 that listens on
// an address and is reached by it, as gRPC clients reach their servers. Measures like
// ../shared/peers/grpc_echo.cc: per case a warm-up, then a window of fixed length; qps = calls
// completed in the window / its length; latency = one call's round trip (request + reply).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "anview/anview.hpp"

namespace perf {

struct RpcOptions {
  std::vector<std::size_t> sizes;  // payload bytes of each case
  std::vector<int> concurrency;    // calls in flight of each case
  int threads = 1;                 // client threads sharing the calls in flight
  double seconds = 3.0;            // measured window per case
  double warmup = 0.5;             // seconds before it
  int handler_threads = 0;         // the server's (0: on the connection's thread)
  std::string listen = "127.0.0.1:0";
  bool check = false;
  bool json = false;
};

// Rank 0 serves, rank 1 measures and prints, other ranks wait. Returns the wrong replies seen.
long run_rpc(anview::Communicator& comm, const RpcOptions& options);

}  // namespace perf
