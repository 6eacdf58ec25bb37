// anview::Communicator — a group of ranks that exchange tagged messages.
//
// Semantics (MPI-like): messages from one sender to one receiver with the same tag are received
// in the order they were sent; receives may use any_source / any_tag; a message that arrives
// before its receive is posted is buffered (up to ANVIEW_UNEXPECTED_BYTES per peer; beyond that
// the sender is back-pressured, nothing is dropped); a receive buffer smaller than the message
// is an error, never a silent truncation. Small messages are sent eagerly; larger ones
// (ANVIEW_EAGER_BYTES, default 64 KiB) use a rendezvous so the payload lands straight in the
// posted receive buffer.
//
// Thread safety: all methods may be called from any thread. A handle is a cheap, movable
// reference; the communicator closes when the last handle goes away, after flushing what was
// sent. A Request outlives it: one still pending then fails with "the communicator was
// closed" (a thread waiting on it gets that error at once).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "anview/collectives.hpp"
#include "anview/error.hpp"
#include "anview/memory.hpp"
#include "anview/request.hpp"
#include "anview/store.hpp"
#include "anview/types.hpp"

namespace anview {

namespace detail {
class CommunicatorImpl;
}

struct CommunicatorOptions {
  // Deadline of blocking calls (and of setting up connections). Zero: ANVIEW_TIMEOUT.
  std::chrono::milliseconds timeout{0};
  // Prefix of this communicator's keys in the store, so several communicators can share one.
  std::string store_prefix = "anview";
  // This communicator speaks for the process: its rank prefixes the log lines and picks the
  // metrics endpoint's port. False for connections a process makes besides its own rank's
  // (RPC and pub/sub connections are two-rank communicators of their own).
  bool names_process = true;
  // This rank's host: ranks with equal ids share a host (shared memory between them,
  // hierarchical collectives across hosts). Empty: ANVIEW_HOST_ID, else the machine's
  // hostname and boot id. Tests set it to emulate several hosts in one process.
  std::string host_id;
};

class Communicator {
 public:
  // Rank, size and store from the launcher's environment (anview-run, torchrun, Open MPI,
  // Slurm; see docs/launching.md). Rank 0 serves the store at the root address.
  static Communicator from_env(CommunicatorOptions options = {});
  // Explicit rank and size over a store every rank shares.
  static Communicator create(int rank, int size, Store store, CommunicatorOptions options = {});

  int rank() const;
  int size() const;

  // Non-blocking send of `bytes` bytes to `peer`. The buffer must stay untouched until the
  // request completes. tag must be below reserved_tags.
  Request isend(const void* data, std::size_t bytes, int peer, Tag tag);
  // Non-blocking receive into `capacity` bytes from `source` (or any_source) with `tag` (or
  // any_tag). The request's status says who sent how much.
  Request irecv(void* data, std::size_t capacity, int source, Tag tag);

  // Blocking helpers: post, then wait with the timeout (default ANVIEW_TIMEOUT). On timeout a
  // receive that has not matched is cancelled; an operation caught mid-transfer closes the link
  // to that peer (its buffer cannot be released otherwise), failing later traffic with it with
  // the same root cause.
  void send(const void* data, std::size_t bytes, int peer, Tag tag,
            std::optional<std::chrono::milliseconds> timeout = {});
  Status recv(void* data, std::size_t capacity, int source, Tag tag,
              std::optional<std::chrono::milliseconds> timeout = {});

  // Collectives. Every rank calls the same collectives in the same order, with the same
  // count, type, operation and root (MPI's rule); one thread at a time per communicator. On
  // one host, differing arguments are a usage Error naming the peer at once; elsewhere a
  // message of the wrong size is a protocol Error naming the call and the peer, and other
  // mismatches end in the timeout, which names the call, the peer and what it waits for. `count` is
  // in elements of `type`; passing the same buffer as send and receive works in place (except
  // alltoall). Each step waits up to the communicator's timeout; a failure names the call
  // ("allreduce #12"), the peer and the cause. A call one rank alone refuses (a usage Error from
  // its own argument checks) still takes its place in that rank's order: the peers' call fails
  // (on one host at once, naming the rank), it never pairs with that rank's next call.
  void allreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op);
  void allreduce(void* data, std::size_t count, DataType type, ReduceOp op) {
    allreduce(data, data, count, type, op);
  }
  void broadcast(void* data, std::size_t count, DataType type, int root);
  // `recv` matters on the root only.
  void reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
              int root);
  // `recv` holds size() blocks of `count` elements; block r comes from rank r.
  void allgather(const void* send, void* recv, std::size_t count, DataType type);
  // `send` holds size() blocks of `count`; this rank receives the reduction of block rank().
  void reduce_scatter(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op);
  // `recv` (root only) holds size() blocks of `count`, block r from rank r.
  void gather(const void* send, void* recv, std::size_t count, DataType type, int root);
  // `send` (root only) holds size() blocks of `count`; rank r receives block r.
  void scatter(const void* send, void* recv, std::size_t count, DataType type, int root);
  // `send` holds size() blocks of `count`: block r goes to rank r; `recv` gets block r from r.
  void alltoall(const void* send, void* recv, std::size_t count, DataType type);
  // The v-variants: every rank's block has its own count, at its own displacement (both in
  // elements, one entry per rank; empty displacements: blocks packed in rank order). Counts
  // must agree between the ranks that exchange a block; a block arriving with another size
  // is an Error naming the peer.
  // allgatherv: this rank's `send_count` elements go to block rank() of every `recv`.
  void allgatherv(const void* send, std::size_t send_count, void* recv,
                  std::span<const std::size_t> recv_counts, std::span<const std::size_t> displs,
                  DataType type);
  // gatherv: the counts and displacements matter on the root only.
  void gatherv(const void* send, std::size_t send_count, void* recv,
               std::span<const std::size_t> recv_counts, std::span<const std::size_t> displs,
               DataType type, int root);
  // scatterv: the counts and displacements matter on the root only.
  void scatterv(const void* send, std::span<const std::size_t> send_counts,
                std::span<const std::size_t> displs, void* recv, std::size_t recv_count,
                DataType type, int root);
  // alltoallv: send block r goes to rank r; receive block r comes from rank r.
  void alltoallv(const void* send, std::span<const std::size_t> send_counts,
                 std::span<const std::size_t> send_displs, void* recv,
                 std::span<const std::size_t> recv_counts, std::span<const std::size_t> recv_displs,
                 DataType type);
  void barrier();

  // Nonblocking collectives: the same operations, started at once and run in call order on the
  // communicator's collective thread (created on the first one), so computation can overlap
  // them. The Request completes when the collective has, with the result's size in
  // status().bytes, or with its Error; wait(), test(), on_complete() and co_await work as for
  // point-to-point requests. Buffers must stay valid and untouched until then. Blocking
  // collectives issued meanwhile queue behind them: every rank must issue its collectives,
  // blocking or not, in the same order.
  Request iallreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op);
  Request iallreduce(void* data, std::size_t count, DataType type, ReduceOp op) {
    return iallreduce(data, data, count, type, op);
  }
  Request ibroadcast(void* data, std::size_t count, DataType type, int root);
  Request ireduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                  int root);
  Request iallgather(const void* send, void* recv, std::size_t count, DataType type);
  Request ireduce_scatter(const void* send, void* recv, std::size_t count, DataType type,
                          ReduceOp op);
  Request ialltoall(const void* send, void* recv, std::size_t count, DataType type);
  Request ibarrier();
  // The v-variants; the counts and displacements are copied at the call (the buffers are not).
  Request iallgatherv(const void* send, std::size_t send_count, void* recv,
                      std::span<const std::size_t> recv_counts, std::span<const std::size_t> displs,
                      DataType type);
  Request igatherv(const void* send, std::size_t send_count, void* recv,
                   std::span<const std::size_t> recv_counts, std::span<const std::size_t> displs,
                   DataType type, int root);
  Request iscatterv(const void* send, std::span<const std::size_t> send_counts,
                    std::span<const std::size_t> displs, void* recv, std::size_t recv_count,
                    DataType type, int root);
  Request ialltoallv(const void* send, std::span<const std::size_t> send_counts,
                     std::span<const std::size_t> send_displs, void* recv,
                     std::span<const std::size_t> recv_counts,
                     std::span<const std::size_t> recv_displs, DataType type);

  // One-sided access (docs/one-sided.md). register_memory makes `bytes` at `data` reachable
  // by the peers that get its key. put/get move `bytes` between a local buffer and the region
  // named by `key`, starting `offset` bytes into it, with no code on the owner's side; they
  // complete when the local buffer may be reused (put) or holds the bytes (get). Operations to
  // one peer are unordered until flush(peer) completes: then every earlier put is in place at
  // the target. A range outside the region is Error(usage) at the call; a key whose region
  // is no longer registered fails the request (usage), and nothing is written. Zero bytes
  // complete at once without asking the owner (nothing moves either way).
  MemoryRegion register_memory(void* data, std::size_t bytes);
  // A new zeroed region of `bytes`, in shared memory that same-host peers map: their puts and
  // gets are then a plain copy, with no system call (like MPI_Win_allocate). The fastest
  // choice for buffers peers on this host reach often (a KV-cache pool).
  MemoryRegion allocate_memory(std::size_t bytes);
  Request put(const void* local, std::size_t bytes, const RemoteKey& key, std::uint64_t offset = 0);
  Request get(void* local, std::size_t bytes, const RemoteKey& key, std::uint64_t offset = 0);
  // Completes when every put and get issued before it to `peer` (to every peer with
  // any_source) has completed at the target. Fails with the first failure among the puts and
  // gets to those peers since the previous flush (their requests fail with it too).
  Request flush(int peer = any_source);

  // A new communicator of the ranks that pass the same `color` (>= 0), ranked by `key` (ties:
  // by rank here). Every rank calls it, like a collective. The new communicator is
  // independent: its own connections, tags and collective sequence.
  Communicator split(int color, int key) const;

  // The algorithm `collective` ("allreduce", "broadcast", ...) uses for `bytes` on this
  // communicator, and why (ANVIEW_ALGO or the tuner's prediction); empty for an unknown name.
  std::string collective_algorithm(std::string_view collective, std::size_t bytes,
                                   std::string* why = nullptr) const;

  // Every candidate algorithm of `collective` for `bytes` on this communicator, with the time
  // the tuner predicts for it (or why it cannot run here), the pick and the measured costs the
  // prediction rests on, as text (anview-info --explain). Every rank calls it, like a
  // collective: the first call that needs the costs measures them.
  std::string explain_collective(std::string_view collective, std::size_t bytes);

  // This communicator's flight recorder and state as JSON: its latest collectives (sequence
  // number, kind, bytes, root, algorithm, start, duration, state: running, stalled with what
  // it waits for, done, failed with the error), its pending point-to-point requests and its
  // peers' transports and failures. The same goes into the process's dumps, written to
  // ANVIEW_DUMP_DIR after errors and stalls and on SIGUSR1, and answered to anview-info --dump.
  std::string dump_state() const;

  // Drives progress once without sleeping (for callbacks and coroutines when nothing waits).
  void progress();

  // The transport serving `peer` ("shm", "tcp", "self"), a description of the link, and why
  // the registry chose that transport (ANVIEW_TRANSPORTS order, the candidates it rejected).
  std::string transport_name(int peer) const;
  std::string describe_peer(int peer) const;
  std::string transport_reason(int peer) const;

 private:
  explicit Communicator(std::shared_ptr<detail::CommunicatorImpl> impl);
  std::shared_ptr<detail::CommunicatorImpl> impl_;
};

}  // namespace anview
