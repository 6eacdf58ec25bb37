#include "collectives/collectives.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "base/config.hpp"
#include "base/cpus.hpp"
#include "collectives/reduce.hpp"

namespace anview::collectives {
namespace {

const base::Setting chunk_setting(
    "collectives", "ANVIEW_COLL_CHUNK", "256K",
    "Reducing ring steps move and reduce data in chunks of this size, so the reduction of one "
    "overlaps the transfer of the next");

}  // namespace

Collectives::Collectives(p2p::Messenger& messenger)
    : messenger_(messenger),
      forced_(read_forced()),
      chunk_bytes_(static_cast<std::size_t>(std::max<std::int64_t>(chunk_setting.as_int(), 4096))),
      watchdog_(watchdog_interval()),
      metrics_([this](base::metrics::Sink& sink) {
        recorder_.collect_metrics(
            sink, {{"rank", std::to_string(messenger_.rank())}, {"comm", messenger_.name()}});
      }) {}

Call Collectives::begin(const char* name, std::size_t bytes, int root) {
  const std::uint64_t seq = ++sequence_;
  recorder_.begin(seq, name, bytes, root);
  posted_.clear();
  return Call{messenger_,
              messenger_.rank(),
              messenger_.size(),
              Tag{reserved_tags + (seq & ((std::uint64_t{1} << 62) - 1))},
              messenger_.default_timeout(),
              name,
              seq,
              posted_,
              scratch_,
              chunk_bytes_,
              reporter_,
              watchdog_,
              /*group=*/nullptr,
              Recording(&recorder_, seq)};  // built in place: the call owns its entry
}

void Collectives::usage(const Call& call, const std::string& cause) const {
  call.record.failed(cause);
  throw Error(ErrorKind::usage, {.rank = call.rank, .operation = call.operation(), .cause = cause});
}

void Collectives::bad_root(const Call& call, int root) const {
  usage(call, "root " + std::to_string(root) + " is not a rank of this communicator (size " +
                  std::to_string(call.size) + ")");
}

void Collectives::bad_count(const Call& call, std::size_t count, DataType type) const {
  if (size_of(type) == 0)
    usage(call, "unknown data type " + std::to_string(static_cast<int>(type)));
  usage(call, "count " + std::to_string(count) + " overflows the buffer size");
}

Blocks Collectives::checked_blocks(const Call& call, std::span<const std::size_t> counts,
                                   std::span<const std::size_t> displs, DataType type,
                                   const char* which) const {
  const auto n = static_cast<std::size_t>(call.size);
  if (counts.size() != n || (!displs.empty() && displs.size() != n)) {
    usage(call, std::string(which) + " counts and displacements need one entry per rank (" +
                    std::to_string(n) + "), not " + std::to_string(counts.size()) + " and " +
                    std::to_string(displs.size()));
  }
  const std::size_t esize = checked_bytes(call, 1, type);
  const std::size_t limit = std::numeric_limits<std::size_t>::max() / esize / 2;
  Blocks b;
  b.offset.resize(n);
  b.bytes.resize(n);
  std::size_t packed = 0;  // no displacements: blocks follow each other in rank order
  for (std::size_t r = 0; r < n; ++r) {
    const std::size_t at = displs.empty() ? packed : displs[r];
    if (counts[r] > limit || at > limit - counts[r])
      usage(call, std::string(which) + " block of rank " + std::to_string(r) +
                      " overflows the buffer size");
    b.offset[r] = at * esize;
    b.bytes[r] = counts[r] * esize;
    packed = at + counts[r];
  }
  return b;
}

Blocks Collectives::root_blocks(const Call& call, std::span<const std::size_t> counts,
                                std::span<const std::size_t> displs, DataType type,
                                std::size_t own_bytes, const void* buffer, const char* which,
                                int root) const {
  if (call.rank != root) return {};
  Blocks blocks = checked_blocks(call, counts, displs, type, which);
  if (blocks.size(root) != own_bytes) {
    usage(call, "the root's own " + std::string(which) + " block is " +
                    std::to_string(counts[static_cast<std::size_t>(root)]) +
                    " elements, but it passes " + std::to_string(own_bytes / size_of(type)) +
                    " for itself");
  }
  check_buffer(call, buffer, total_bytes(blocks), which);
  return blocks;
}

std::size_t Collectives::total_bytes(const Blocks& blocks) {
  std::size_t end = 0;
  for (std::size_t r = 0; r < blocks.offset.size(); ++r)
    end = std::max(end, blocks.offset[r] + blocks.bytes[r]);
  return end;
}

void Collectives::null_buffer(const Call& call, const char* which) const {
  usage(call, std::string("null ") + which + " buffer");
}

int Collectives::local_placement() const {
  std::call_once(placement_once_, [this] {
    const int n = messenger_.size();
    peer_memories_.assign(static_cast<std::size_t>(n), nullptr);
    shared_areas_ = SharedAreas{};
    shared_areas_.peers.assign(static_cast<std::size_t>(n), nullptr);
    shared_areas_.seen.assign(static_cast<std::size_t>(n), 0);
    shared_areas_.skip_ahead.assign(static_cast<std::size_t>(n), 0);
    shared_areas_.checked.assign(static_cast<std::size_t>(n), 0);
    const transport::SharedArea own = messenger_.own_area();
    const int cpus = base::usable_cpus();
    shared_areas_.crowded = cpus > 0 && cpus < n;
    shared_areas_.own = own.bytes >= shared_area_needed() ? own.data : nullptr;
    bool read_all = n > 1, share_all = n > 1 && shared_areas_.own != nullptr;
    for (int p = 0; p < n; ++p) {
      if (p == messenger_.rank()) continue;
      const auto u = static_cast<std::size_t>(p);
      peer_memories_[u] = messenger_.peer_memory(p);
      shared_areas_.peers[u] = messenger_.peer_area(p);
      read_all = read_all && peer_memories_[u] != nullptr;
      share_all = share_all && shared_areas_.peers[u] != nullptr;
    }
    local_placement_ = (read_all ? reads_peers : 0) | (share_all ? shares_memory : 0);
  });
  return local_placement_;
}

int Collectives::agree_placement() {
  if (agreed_placement_.load(std::memory_order_acquire) < 0) {
    // Every rank's view and host: the bits that hold everywhere, and who shares a host.
    Call call = begin("placement agreement");
    const auto n = static_cast<std::size_t>(call.size);
    const auto me = static_cast<std::size_t>(call.rank);
    std::vector<std::uint64_t> all(2 * n);
    all[2 * me] = static_cast<std::uint64_t>(local_placement());
    all[2 * me + 1] = std::hash<std::string>{}(messenger_.host_id());
    run_guarded(call, [&] {
      allgather_bruck(call, all.data(), 2 * sizeof(std::uint64_t));  // log2(p) rounds
    });
    std::uint64_t bits = reads_peers | shares_memory;
    std::vector<std::uint64_t> hosts(n);
    for (std::size_t r = 0; r < n; ++r) {
      bits &= all[2 * r];
      hosts[r] = all[2 * r + 1];
    }
    layout_ = HostLayout::from_keys(hosts);
    agreed_placement_.store(static_cast<int>(bits), std::memory_order_release);
  }
  return agreed_placement_.load(std::memory_order_acquire);
}

bool Collectives::placement_allows(int bit) const {
  const int agreed = agreed_placement_.load(std::memory_order_acquire);
  return ((agreed >= 0 ? agreed : local_placement()) & bit) != 0;
}

char* Collectives::work_buffer(std::size_t bytes) {
  if (work_.size() < bytes) work_.resize(bytes);
  return work_.data();
}

char* Collectives::work_copy(const void* from, std::size_t bytes) {
  char* work = work_buffer(bytes);
  if (bytes > 0) std::memcpy(work, from, bytes);
  return work;
}

void Collectives::allreduce(const void* send, void* recv, std::size_t count, DataType type,
                            ReduceOp op) {
  Call call = begin("allreduce", record_bytes(count, type));
  const std::size_t bytes = checked_bytes(call, count, type);
  if (const auto why = unsupported(type, op); !why.empty()) usage(call, why);
  check_buffer(call, send, bytes, "send");
  check_buffer(call, recv, bytes, "receive");
  check_known(call);
  if (call.size == 1 || count == 0) {
    if (send != recv && bytes > 0) std::memcpy(recv, send, bytes);
    return;
  }
  // Every rank reaches the same decisions: they depend on the arguments every rank passes alike
  // and on agreed state. Not on whether the call is in place: ranks may differ in that (as in
  // NCCL), so the tuner charges every call the copy of an out-of-place one.
  const std::string_view algo = choose(call, "allreduce", bytes, size_of(type),
                                       allreduce_shared_slot_bytes(bytes, call.size));
  if (algo == "shared") {
    run_guarded(call, [&] {
      allreduce_shared(call, shared_areas_, shared_calls_, send, recv, count, type, op);
    });
    return;
  }
  if (algo == "hierarchical") {
    if (send != recv) std::memcpy(recv, send, bytes);
    const std::string among = step_algorithm("allreduce", bytes, size_of(type), false);
    run_guarded(call, [&] { allreduce_hierarchical(call, layout_, among, recv, count, type, op); });
    if (op == ReduceOp::avg) finish_avg(recv, count, type, call.size);
    return;
  }
  if (algo == "direct") {
    run_guarded(call, [&] { allreduce_direct(call, peer_memories_, send, recv, count, type, op); });
    return;
  }
  // The ring needs at least one element per rank to be worth its 2(n-1) steps; Rabenseifner's
  // halving copes with empty segments (it runs only when forced). Both reduce from `send`
  // into `recv` (no copy of the whole buffer first: a tenth of a 16 MiB call over TCP).
  if (algo == "rabenseifner")
    run_guarded(call, [&] { allreduce_rabenseifner(call, send, recv, count, type, op); });
  else if (algo == "ring" && count >= static_cast<std::size_t>(call.size))
    run_guarded(call, [&] { allreduce_ring(call, send, recv, count, type, op); });
  else {
    if (send != recv) std::memcpy(recv, send, bytes);
    call.record.algorithm("recursive_doubling");
    run_guarded(call, [&] { allreduce_recursive_doubling(call, recv, count, type, op); });
  }
  if (op == ReduceOp::avg) finish_avg(recv, count, type, call.size);
}

void Collectives::broadcast(void* data, std::size_t count, DataType type, int root) {
  Call call = begin("broadcast", record_bytes(count, type), root);
  const std::size_t bytes = checked_bytes(call, count, type);
  check_root(call, root);
  check_buffer(call, data, bytes, "data");
  check_known(call);
  if (call.size == 1) return;
  const std::string_view algo = choose(call, "broadcast", bytes, size_of(type), bytes);
  if (algo == "shared") {
    const std::uint64_t seq = ++shared_calls_;
    run_guarded(call, [&] { broadcast_shared(call, shared_areas_, seq, data, bytes, root); });
    return;
  }
  if (algo == "hierarchical") {
    const BroadcastSteps steps{.between = step_algorithm("broadcast", bytes, size_of(type), false),
                               .within = step_algorithm("broadcast", bytes, size_of(type), true)};
    run_guarded(call, [&] { broadcast_hierarchical(call, layout_, steps, data, bytes, root); });
  } else if (algo == "chain")
    run_guarded(call, [&] { broadcast_chain(call, data, bytes, root); });
  else
    run_guarded(call, [&] { broadcast_binomial(call, data, bytes, root); });
}

void Collectives::reduce(const void* send, void* recv, std::size_t count, DataType type,
                         ReduceOp op, int root) {
  Call call = begin("reduce", record_bytes(count, type), root);
  const std::size_t bytes = checked_bytes(call, count, type);
  if (const auto why = unsupported(type, op); !why.empty()) usage(call, why);
  check_root(call, root);
  check_buffer(call, send, bytes, "send");
  if (call.rank == root) check_buffer(call, recv, bytes, "receive");
  check_known(call);
  const std::string_view algo =
      call.size > 1 ? choose(call, "reduce", bytes, size_of(type), bytes) : "binomial";
  if (algo == "shared") {
    const std::uint64_t seq = ++shared_calls_;
    run_guarded(
        call, [&] { reduce_shared(call, shared_areas_, seq, send, recv, count, type, op, root); });
    return;
  }
  if (algo == "hierarchical") {
    // In place: the root works in its receive buffer, the others in a copy.
    void* work = recv;
    if (call.rank != root) {
      work = work_copy(send, bytes);
    } else if (send != recv && bytes > 0) {
      std::memcpy(recv, send, bytes);
    }
    run_guarded(call, [&] { reduce_hierarchical(call, layout_, work, count, type, op, root); });
  } else {
    // The tree reduces from `send` into the root's receive buffer or another rank's work
    // buffer (leaves send `send` itself).
    call.record.algorithm("binomial");
    void* work = call.rank == root ? recv : work_buffer(bytes);
    run_guarded(call, [&] { reduce_binomial(call, send, work, count, type, op, root); });
  }
  if (call.rank == root && op == ReduceOp::avg) finish_avg(recv, count, type, call.size);
}

void Collectives::allgather(const void* send, void* recv, std::size_t count, DataType type) {
  Call call = begin("allgather", record_bytes(count, type));
  const std::size_t block = checked_bytes(call, count, type);
  check_buffer(call, send, block, "send");
  check_buffer(call, recv, block, "receive");
  check_known(call);
  const std::string_view algo =
      call.size > 1 ? choose(call, "allgather", block * static_cast<std::size_t>(call.size),
                             size_of(type), block)
                    : "ring";
  if (algo == "shared") {
    const std::uint64_t seq = ++shared_calls_;
    run_guarded(call, [&] { allgather_shared(call, shared_areas_, seq, send, recv, block); });
    return;
  }
  char* mine = static_cast<char*>(recv) + static_cast<std::size_t>(call.rank) * block;
  // memmove: the contribution may lie in the receive buffer, over its own block.
  if (send != mine && block > 0) std::memmove(mine, send, block);
  if (call.size == 1) return;
  if (algo == "hierarchical") {
    const std::string within = step_algorithm(
        "broadcast", block * static_cast<std::size_t>(call.size), size_of(type), true);
    run_guarded(call, [&] { allgather_hierarchical(call, layout_, within, recv, block); });
  } else if (algo == "bruck")
    run_guarded(call, [&] { allgather_bruck(call, recv, block); });
  else
    run_guarded(call, [&] { allgather_ring(call, recv, Blocks::uniform(call.size, block)); });
}

void Collectives::allgatherv(const void* send, std::size_t send_count, void* recv,
                             std::span<const std::size_t> recv_counts,
                             std::span<const std::size_t> displs, DataType type) {
  Call call = begin("allgatherv", record_bytes(send_count, type));
  const std::size_t bytes = checked_bytes(call, send_count, type);
  const Blocks blocks = checked_blocks(call, recv_counts, displs, type, "receive");
  if (blocks.size(call.rank) != bytes) {
    usage(call, "this rank sends " + std::to_string(send_count) +
                    " elements but its own entry of "
                    "the receive counts is " +
                    std::to_string(recv_counts[static_cast<std::size_t>(call.rank)]));
  }
  check_buffer(call, send, bytes, "send");
  check_buffer(call, recv, total_bytes(blocks), "receive");
  char* mine = blocks.at(recv, call.rank);
  // memmove: the contribution may lie in the receive buffer, over its own block.
  if (send != mine && bytes > 0) std::memmove(mine, send, bytes);
  call.record.algorithm("ring");
  if (call.size > 1) run_guarded(call, [&] { allgather_ring(call, recv, blocks); });
}

void Collectives::reduce_scatter(const void* send, void* recv, std::size_t count, DataType type,
                                 ReduceOp op) {
  Call call = begin("reduce_scatter", record_bytes(count, type));
  const std::size_t block = checked_bytes(call, count, type);
  if (const auto why = unsupported(type, op); !why.empty()) usage(call, why);
  check_buffer(call, send, block, "send");
  check_buffer(call, recv, block, "receive");
  check_known(call);
  const std::size_t all = block * static_cast<std::size_t>(call.size);
  const std::string_view algo = call.size > 1 && count > 0
                                    ? choose(call, "reduce_scatter", all, size_of(type), block)
                                    : "ring";
  if (algo == "direct") {
    run_guarded(call,
                [&] { reduce_scatter_direct(call, peer_memories_, send, recv, count, type, op); });
    return;
  }
  // Both reduce from `send` into a work buffer (no copy of `send` first); the ring's last step
  // reduces this rank's block straight into `recv`.
  const std::size_t mine = static_cast<std::size_t>(call.rank) * block;
  if (call.size == 1 || count == 0) {
    call.record.algorithm("ring");
    if (block > 0 && static_cast<const char*>(send) + mine != recv)
      std::memmove(recv, static_cast<const char*>(send) + mine, block);
  } else if (algo == "recursive_halving") {
    char* work = work_buffer(all);
    run_guarded(call, [&] { reduce_scatter_recursive_halving(call, send, work, count, type, op); });
    std::memcpy(recv, work + mine, block);
  } else {
    call.record.algorithm("ring");
    char* work = work_buffer(all);
    run_guarded(call, [&] { reduce_scatter_ring(call, send, work, recv, count, type, op); });
  }
  if (op == ReduceOp::avg) finish_avg(recv, count, type, call.size);
}

void Collectives::gather(const void* send, void* recv, std::size_t count, DataType type, int root) {
  Call call = begin("gather", record_bytes(count, type), root);
  const std::size_t block = checked_bytes(call, count, type);
  check_root(call, root);
  check_buffer(call, send, block, "send");
  if (call.rank == root) check_buffer(call, recv, block, "receive");
  call.record.algorithm("linear");
  run_guarded(call, [&] {
    gather_linear(call, send, block, recv, Blocks::uniform(call.size, block), root);
  });
}

void Collectives::gatherv(const void* send, std::size_t send_count, void* recv,
                          std::span<const std::size_t> recv_counts,
                          std::span<const std::size_t> displs, DataType type, int root) {
  Call call = begin("gatherv", record_bytes(send_count, type), root);
  const std::size_t bytes = checked_bytes(call, send_count, type);
  check_root(call, root);
  check_buffer(call, send, bytes, "send");
  const Blocks blocks = root_blocks(call, recv_counts, displs, type, bytes, recv, "receive", root);
  call.record.algorithm("linear");
  run_guarded(call, [&] { gather_linear(call, send, bytes, recv, blocks, root); });
}

void Collectives::scatter(const void* send, void* recv, std::size_t count, DataType type,
                          int root) {
  Call call = begin("scatter", record_bytes(count, type), root);
  const std::size_t block = checked_bytes(call, count, type);
  check_root(call, root);
  if (call.rank == root) check_buffer(call, send, block, "send");
  check_buffer(call, recv, block, "receive");
  call.record.algorithm("linear");
  run_guarded(call, [&] {
    scatter_linear(call, send, Blocks::uniform(call.size, block), recv, block, root);
  });
}

void Collectives::scatterv(const void* send, std::span<const std::size_t> send_counts,
                           std::span<const std::size_t> displs, void* recv, std::size_t recv_count,
                           DataType type, int root) {
  Call call = begin("scatterv", record_bytes(recv_count, type), root);
  const std::size_t bytes = checked_bytes(call, recv_count, type);
  check_root(call, root);
  check_buffer(call, recv, bytes, "receive");
  const Blocks blocks = root_blocks(call, send_counts, displs, type, bytes, send, "send", root);
  call.record.algorithm("linear");
  run_guarded(call, [&] { scatter_linear(call, send, blocks, recv, bytes, root); });
}

void Collectives::alltoall(const void* send, void* recv, std::size_t count, DataType type) {
  Call call = begin("alltoall", record_bytes(count, type));
  const std::size_t block = checked_bytes(call, count, type);
  check_buffer(call, send, block, "send");
  check_buffer(call, recv, block, "receive");
  if (send == recv && block > 0) usage(call, "alltoall cannot run in place");
  check_known(call);
  const std::string_view algo =
      call.size > 1 ? choose(call, "alltoall", block * static_cast<std::size_t>(call.size),
                             size_of(type), block)
                    : "pairwise";
  if (algo == "bruck") {
    run_guarded(call, [&] { alltoall_bruck(call, send, recv, block); });
    return;
  }
  const Blocks blocks = Blocks::uniform(call.size, block);
  run_guarded(call, [&] { alltoall_pairwise(call, send, blocks, recv, blocks); });
}

void Collectives::alltoallv(const void* send, std::span<const std::size_t> send_counts,
                            std::span<const std::size_t> send_displs, void* recv,
                            std::span<const std::size_t> recv_counts,
                            std::span<const std::size_t> recv_displs, DataType type) {
  Call call = begin("alltoallv");
  const Blocks sblocks = checked_blocks(call, send_counts, send_displs, type, "send");
  const Blocks rblocks = checked_blocks(call, recv_counts, recv_displs, type, "receive");
  check_buffer(call, send, total_bytes(sblocks), "send");
  check_buffer(call, recv, total_bytes(rblocks), "receive");
  if (send == recv && total_bytes(sblocks) > 0) usage(call, "alltoallv cannot run in place");
  call.record.algorithm("pairwise");
  run_guarded(call, [&] { alltoall_pairwise(call, send, sblocks, recv, rblocks); });
}

void Collectives::barrier() {
  Call call = begin("barrier");
  check_known(call);
  if (call.size > 1 && choose(call, "barrier", 0, 1, 0) == "shared") {
    const std::uint64_t seq = ++shared_calls_;
    run_guarded(call, [&] { barrier_shared(call, shared_areas_, seq); });
    return;
  }
  run_guarded(call, [&] { barrier_dissemination(call); });
}

}  // namespace anview::collectives
