// What a Communicator handle points to: the store it bootstrapped from and the p2p engine.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "anview/communicator.hpp"
#include "collectives/collectives.hpp"
#include "core/collective_worker.hpp"
#include "core/hang_doctor.hpp"
#include "p2p/messenger.hpp"

namespace anview::detail {

class CommunicatorImpl {
 public:
  // Bootstraps: job id, address exchange through the store, connections to every peer.
  CommunicatorImpl(int rank, int size, Store store, const CommunicatorOptions& options);
  // Flushes and closes; requests still pending fail with "the communicator was closed".
  ~CommunicatorImpl();

  p2p::Messenger& messenger() { return *messenger_; }
  collectives::Collectives& collectives() { return *collectives_; }
  Store& store() { return store_; }
  const std::string& store_prefix() const { return prefix_; }
  // Numbers the splits of this communicator (all ranks split in the same order).
  std::uint64_t next_split() { return ++splits_; }

  // Runs a blocking collective: at once while no nonblocking collective was ever issued, else
  // on the worker behind everything queued (the order all ranks share), waiting for it.
  // A template (defined in communicator.cpp, its only user): the job runs in place, without a
  // std::function and its allocation, on the path every small collective takes.
  template <typename Job>
  void run_collective(const char* name, Job&& job);
  // Starts a nonblocking collective on the worker (started on first use); the Request
  // completes with `bytes` in its status, or with the collective's Error.
  Request start_collective(const char* name, std::size_t bytes, std::function<void()> job);

  // This communicator's state for the flight recorder's dumps (dump_service.hpp): its
  // latest collectives, pending point-to-point requests and peers.
  nlohmann::ordered_json state() const;
  // A failed call's dump (not for usage errors: those are the caller's, and said at once).
  static void dump_after(const Error& error);

 private:
  Store store_;
  std::string prefix_;
  bool names_process_;
  std::uint64_t splits_ = 0;
  std::shared_ptr<p2p::Messenger> messenger_;
  std::unique_ptr<HangDoctor> doctor_;  // before collectives_, which reports to it
  std::unique_ptr<collectives::Collectives> collectives_;
  std::mutex worker_mu_;                      // creates worker_
  std::unique_ptr<CollectiveWorker> worker_;  // destroyed before collectives_
  // worker_ once it exists: a blocking collective reads it with no lock (an uncontended
  // mutex round was ~7 % of an 8-byte same-host broadcast).
  std::atomic<CollectiveWorker*> worker_started_{nullptr};
  std::uint64_t dump_source_ = 0;  // registered with the DumpService
};

}  // namespace anview::detail
