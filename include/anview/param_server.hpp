// anview::ParamServer / ParamClient — a sharded parameter server on Anview's RPC.
//
// Keys (names of dense tensors) are spread over the servers by consistent hashing with virtual
// nodes (HashRing): adding or removing a server moves about 1/N of the keys. Workers push
// updates, which the owning server aggregates into the stored value (sum, or average over the
// workers), and pull the value back:
//   - asynchronous: each push is applied when it arrives; a pull returns the value as it is;
//   - synchronous: a push belongs to a step; the server applies step s of a key once every
//     worker has pushed it, and a pull for step s waits until then, so every worker sees the
//     same value after each step.
// A key takes the dtype and size of its first push (or set); later pushes must match.
//
// Membership changes (ParamClient::add_server, remove_server) give the ring a new epoch. Every
// server learns it, hands the keys it no longer owns (their values and the steps in progress) to
// their new owners, and answers requests for them with the new ring; clients that had the old
// ring follow it and retry, so no key and no update is lost during the move.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "anview/collectives.hpp"
#include "anview/rpc.hpp"

namespace anview {

namespace detail {
class ParamServerImpl;
class ParamClientImpl;
}  // namespace detail

// Consistent hashing with virtual nodes: each server owns the arcs before its points.
class HashRing {
 public:
  explicit HashRing(std::vector<std::string> servers = {}, int virtual_nodes = 128);
  void add(const std::string& server);
  void remove(const std::string& server);
  // The server owning `key` (the ring must not be empty).
  const std::string& owner(std::string_view key) const;
  const std::vector<std::string>& servers() const { return servers_; }
  int virtual_nodes() const { return virtual_nodes_; }

 private:
  void rebuild();
  std::vector<std::string> servers_;
  int virtual_nodes_;
  std::vector<std::pair<std::uint64_t, std::size_t>> points_;  // (position, server index)
};

enum class Aggregation : std::uint8_t { sum, average };

struct ParamServerOptions {
  bool synchronous = false;
  // The workers (ParamClients) whose pushes make a step (synchronous), and the divisor of
  // average.
  int workers = 1;
  Aggregation aggregation = Aggregation::sum;
  ServerOptions rpc{};
};

class ParamServer {
 public:
  // Listens on `host_port` (port 0: a free one, see address()).
  static ParamServer listen(const std::string& host_port, ParamServerOptions options = {});
  std::string address() const;
  // Keys stored here now.
  std::size_t keys() const;
  void shutdown();

 private:
  explicit ParamServer(std::shared_ptr<detail::ParamServerImpl> impl);
  std::shared_ptr<detail::ParamServerImpl> impl_;
};

struct ParamClientOptions {
  int virtual_nodes = 128;
  // Deadline of each push and pull (a synchronous pull waits for the slowest worker).
  std::chrono::milliseconds deadline{0};  // zero: ANVIEW_TIMEOUT
};

class ParamClient {
 public:
  // A worker (or an administrator) of the servers at `servers`, which all run the same
  // options. Tells them the ring if they have none.
  static ParamClient connect(std::vector<std::string> servers, ParamClientOptions options = {});

  // Aggregates `count` elements of `type` at `data` into `key` (step: see synchronous mode).
  // Synchronous: one client is one worker, and a step of a key takes one push of each client; a
  // second one (a retry after a lost reply) is refused with an error, not counted twice.
  void push(std::string_view key, const void* data, std::size_t count, DataType type,
            std::uint64_t step = 0);
  // The value of `key` after `step` (synchronous) or now, into `out` (`count` elements).
  void pull(std::string_view key, void* out, std::size_t count, DataType type,
            std::uint64_t step = 0);
  // Sets the value of `key` (creating it), replacing what was there.
  void set(std::string_view key, const void* data, std::size_t count, DataType type);

  // Membership: the new ring goes to every server, which moves keys to their new owners.
  void add_server(const std::string& address);
  void remove_server(const std::string& address);
  // The ring this client uses now (a copy: pushes on other threads may move it on).
  HashRing ring() const;

 private:
  explicit ParamClient(std::shared_ptr<detail::ParamClientImpl> impl);
  std::shared_ptr<detail::ParamClientImpl> impl_;
};

}  // namespace anview
