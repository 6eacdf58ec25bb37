// Connections by address for the patterns (RPC, pub/sub): a server listens on host:port; each
// client that connects gets a private two-rank communicator with it (server rank 0, client
// rank 1), bootstrapped through a TCP store the listener serves. The transport is chosen as for
// any communicator (shm on one host, tcp across hosts); the store carries the job secret and
// TLS settings like every other (ANVIEW_SECRET, ANVIEW_TLS).
//
// The store's keys, under the service's name ("rpc", "pubsub"):
//   <service>/kind          the service, set by the listener (a client of another kind is told)
//   <service>/clients       a counter: each client takes the next number n
//   <service>/conn/<n>      set by client n once it has its number; the listener accepts it
//   <service>/c<n>/...      the keys of connection n's communicator
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "anview/communicator.hpp"
#include "anview/store.hpp"

namespace anview::patterns {

class Listener {
 public:
  // Runs for each accepted connection on a thread of its own, until it returns; `stop()`
  // tells it to (its communicator's waits should poll `stopping()`).
  using Serve = std::function<void(Communicator comm, std::uint64_t id)>;

  Listener(const std::string& host_port, std::string service, std::chrono::milliseconds timeout,
           Serve serve);
  ~Listener();  // stop()
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  std::string address() const { return address_; }
  bool stopping() const { return stopping_.load(std::memory_order_acquire); }
  const std::atomic<bool>& stop_flag() const { return stopping_; }
  // Stops accepting and joins every connection thread (they must notice stopping()). Not from
  // a connection thread (it would join itself): that one calls request_stop().
  void stop();
  // Stops accepting and tells the connection threads, without waiting for them.
  void request_stop() { stopping_.store(true, std::memory_order_release); }

 private:
  void accept_loop();
  void start_connection(std::uint64_t id);
  void reap_finished();

  std::string service_;
  std::chrono::milliseconds timeout_;
  Serve serve_;
  Store store_;
  std::string address_;
  std::atomic<bool> stopping_{false};
  std::mutex stop_mu_;  // held while stop() joins: a second stop() returns when they are joined
  bool joined_ = false;
  std::mutex mu_;
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> finished;
  };
  std::list<Worker> workers_;
  std::thread acceptor_;
};

// A client's side of a connection to the listener of `service` at `address`: the server is
// rank 0 of the returned communicator.
Communicator connect_to(const std::string& address, const std::string& service,
                        std::chrono::milliseconds timeout);

// Waits for `request` in slices, checking `stopping` between them (a server's connection threads
// wait for their next request this way); false when `stopping` turned true first. Raises the
// request's Error.
bool wait_unless_stopping(Request& request, const std::atomic<bool>& stopping);

// Sends `bytes` to `peer` on `tag`, keeping them until the send completes; then runs `done`.
void send_owned(Communicator& comm, int peer, Tag tag, std::vector<std::byte> bytes,
                std::function<void()> done = {});

// Cancels a receive a thread stops waiting for; one that has matched already is let finish
// (up to a second, then abandoned: its link closes), so its buffer may be released afterwards.
void cancel_or_finish(Request& request);

}  // namespace anview::patterns
