#include "collectives/collectives.hpp"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "base/config.hpp"
#include "collectives/reduce.hpp"

namespace anview::collectives {
namespace {

const base::Setting algo_setting(
    "collectives", "ANVIEW_ALGO", "",
    "Forces algorithms, e.g. allreduce=ring, allreduce=recursive_doubling or allreduce=direct "
    "(default: chosen by message size and placement)");
const base::Setting small_allreduce_setting(
    "collectives", "ANVIEW_ALLREDUCE_SMALL_BYTES", "64K",
    "allreduce up to this size uses recursive doubling (latency-bound); above it the ring "
    "(bandwidth-bound)");

const base::Setting direct_allreduce_setting(
    "collectives", "ANVIEW_ALLREDUCE_DIRECT_BYTES", "256K",
    "allreduce from this size reads peers' buffers directly when every rank is on one host and "
    "cross-memory attach works (reduce-by-segment, no messages per chunk)");

const base::Setting shared_allreduce_setting(
    "collectives", "ANVIEW_ALLREDUCE_SHARED_BYTES", "64K",
    "allreduce up to this size (at most 64K) goes through the ranks' shared memory when every "
    "rank is on one host with the shm transport: no messages, a few cache-line transfers");

const base::Setting chunk_setting(
    "collectives", "ANVIEW_COLL_CHUNK", "256K",
    "Reducing ring steps move and reduce data in chunks of this size, so the reduction of one "
    "overlaps the transfer of the next");

// The value forced for `collective` in ANVIEW_ALGO, or empty.
std::string forced(const std::string& collective) {
  for (const auto& item : algo_setting.as_list()) {
    const auto eq = item.find('=');
    if (eq != std::string::npos && item.substr(0, eq) == collective) return item.substr(eq + 1);
  }
  return {};
}

}  // namespace

Collectives::Collectives(p2p::Messenger& messenger)
    : messenger_(messenger),
      forced_allreduce_(forced("allreduce")),
      small_allreduce_bytes_(static_cast<std::size_t>(small_allreduce_setting.as_int())),
      direct_allreduce_bytes_(static_cast<std::size_t>(direct_allreduce_setting.as_int())),
      shared_allreduce_bytes_(std::min<std::size_t>(
          static_cast<std::size_t>(shared_allreduce_setting.as_int()), shared_slot_payload)),
      chunk_bytes_(static_cast<std::size_t>(std::max<std::int64_t>(chunk_setting.as_int(), 4096))) {
}

Call Collectives::begin(const char* name) {
  const std::uint64_t seq = ++sequence_;
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
              chunk_bytes_};
}

void Collectives::usage(const Call& call, const std::string& cause) const {
  throw Error(ErrorKind::usage, {.rank = call.rank, .operation = call.operation(), .cause = cause});
}

void Collectives::check_root(const Call& call, int root) const {
  if (root < 0 || root >= call.size) {
    usage(call, "root " + std::to_string(root) + " is not a rank of this communicator (size " +
                    std::to_string(call.size) + ")");
  }
}

std::size_t Collectives::checked_bytes(const Call& call, std::size_t count, DataType type) const {
  const std::size_t esize = size_of(type);
  if (esize == 0) usage(call, "unknown data type " + std::to_string(static_cast<int>(type)));
  const std::size_t limit =
      std::numeric_limits<std::size_t>::max() / (esize * static_cast<std::size_t>(call.size));
  if (count > limit) usage(call, "count " + std::to_string(count) + " overflows the buffer size");
  return count * esize;
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

void Collectives::check_buffer(const Call& call, const void* p, std::size_t bytes,
                               const char* which) const {
  if (p == nullptr && bytes > 0) usage(call, std::string("null ") + which + " buffer");
}

int Collectives::local_placement() const {
  std::call_once(placement_once_, [this] {
    const int n = messenger_.size();
    peer_memories_.assign(static_cast<std::size_t>(n), nullptr);
    shared_areas_ = SharedAreas{};
    shared_areas_.peers.assign(static_cast<std::size_t>(n), nullptr);
    const transport::SharedArea own = messenger_.own_area();
    cpu_set_t cpus;
    shared_areas_.crowded = ::sched_getaffinity(0, sizeof cpus, &cpus) == 0 && CPU_COUNT(&cpus) < n;
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

int Collectives::placement() {
  if (agreed_placement_.load(std::memory_order_acquire) < 0) {
    Call call = begin("placement agreement");
    std::int32_t bits = local_placement();
    run_guarded(call, [&] {
      allreduce_recursive_doubling(call, &bits, 1, DataType::int32, ReduceOp::band);
    });
    agreed_placement_.store(bits, std::memory_order_release);
  }
  return agreed_placement_.load(std::memory_order_acquire);
}

bool Collectives::placement_allows(int bit) const {
  const int agreed = agreed_placement_.load(std::memory_order_acquire);
  return ((agreed >= 0 ? agreed : local_placement()) & bit) != 0;
}

std::string Collectives::allreduce_choice(std::size_t bytes, std::string* why) const {
  auto say = [&](std::string text) {
    if (why) *why = std::move(text);
  };
  if (!forced_allreduce_.empty()) {
    say("forced by ANVIEW_ALGO");
    return forced_allreduce_;
  }
  const std::string size = std::to_string(bytes) + " B";
  if (bytes <= shared_allreduce_bytes_ && placement_allows(shares_memory)) {
    say(size +
        " <= ANVIEW_ALLREDUCE_SHARED_BYTES and every rank maps its peers' shared memory (one "
        "host): contributions published in place, no messages");
    return "shared";
  }
  if (bytes >= direct_allreduce_bytes_ && placement_allows(reads_peers)) {
    say(size +
        " >= ANVIEW_ALLREDUCE_DIRECT_BYTES and every rank can read its peers' memory "
        "(one host, cross-memory attach)");
    return "direct";
  }
  const char* same_host = "";
  if (bytes >= direct_allreduce_bytes_)
    same_host = "; direct needs every rank on one host with cross-memory attach";
  else if (bytes <= shared_allreduce_bytes_)
    same_host = "; shared needs every rank on one host with the shm transport";
  if (bytes > small_allreduce_bytes_) {
    say(size + " > ANVIEW_ALLREDUCE_SMALL_BYTES: bandwidth-bound" + same_host);
    return "ring";
  }
  say(size + " <= ANVIEW_ALLREDUCE_SMALL_BYTES: latency-bound" + same_host);
  return "recursive_doubling";
}

std::string Collectives::algorithm(std::string_view collective, std::size_t bytes,
                                   std::string* why) const {
  if (collective == "allreduce") return allreduce_choice(bytes, why);
  // allgather's `bytes` is the whole receive buffer (nccl-tests' size), so a block is 1/n.
  const bool fits = (collective == "broadcast" && bytes <= shared_slot_payload) ||
                    (collective == "reduce" && bytes <= shared_allreduce_bytes_) ||
                    (collective == "allgather" &&
                     bytes / static_cast<std::size_t>(messenger_.size()) <= shared_slot_payload) ||
                    collective == "barrier";
  if (fits && messenger_.size() > 1) {
    if (placement_allows(shares_memory)) {
      if (why) *why = "every rank maps its peers' shared memory (one host): no messages";
      return "shared";
    }
  }
  static const std::pair<std::string_view, std::string_view> fixed[] = {
      {"broadcast", "binomial"},  {"reduce", "binomial"},      {"allgather", "ring"},
      {"reduce_scatter", "ring"}, {"alltoall", "pairwise"},    {"gather", "linear"},
      {"scatter", "linear"},      {"barrier", "dissemination"}};
  for (const auto& [name, algo] : fixed) {
    if (name == collective) {
      if (why) *why = "the only algorithm implemented so far";
      return std::string(algo);
    }
  }
  return {};
}

void Collectives::allreduce(const void* send, void* recv, std::size_t count, DataType type,
                            ReduceOp op) {
  Call call = begin("allreduce");
  const std::size_t bytes = checked_bytes(call, count, type);
  if (const auto why = unsupported(type, op); !why.empty()) usage(call, why);
  check_buffer(call, send, bytes, "send");
  check_buffer(call, recv, bytes, "receive");
  if (!forced_allreduce_.empty() && forced_allreduce_ != "ring" &&
      forced_allreduce_ != "recursive_doubling" && forced_allreduce_ != "direct" &&
      forced_allreduce_ != "shared")
    usage(call, "ANVIEW_ALGO names allreduce=" + forced_allreduce_ +
                    "; known: ring, recursive_doubling, direct, shared");
  if (call.size == 1 || count == 0) {
    if (send != recv && bytes > 0) std::memcpy(recv, send, bytes);
    return;
  }
  // Every rank reaches the same decisions: they depend on the arguments and on agreed state.
  if (forced_allreduce_.empty() || forced_allreduce_ == "direct" || forced_allreduce_ == "shared")
    placement();
  const std::string algo = allreduce_choice(bytes, nullptr);
  if ((algo == "direct" && !placement_allows(reads_peers)) ||
      (algo == "shared" && !placement_allows(shares_memory))) {
    usage(call, "ANVIEW_ALGO forces allreduce=" + algo +
                    ", but not every rank can use it (it needs all ranks on one host with the shm "
                    "transport" +
                    (algo == "direct" ? std::string(" and cross-memory attach") : "") +
                    "; anview-info tells why not)");
  }
  if (algo == "shared" && bytes > shared_slot_payload) {
    usage(call, "allreduce=shared holds at most " + std::to_string(shared_slot_payload) +
                    " bytes, not " + std::to_string(bytes));
  }
  if (algo == "shared") {
    const std::uint64_t seq = ++shared_calls_;
    run_guarded(call,
                [&] { allreduce_shared(call, shared_areas_, seq, send, recv, count, type, op); });
    return;
  }
  if (algo == "direct") {
    run_guarded(call, [&] { allreduce_direct(call, peer_memories_, send, recv, count, type, op); });
    return;
  }
  if (send != recv) std::memcpy(recv, send, bytes);
  // The ring needs at least one element per rank to be worth its 2(n-1) steps.
  if (algo == "ring" && count >= static_cast<std::size_t>(call.size))
    run_guarded(call, [&] { allreduce_ring(call, recv, count, type, op); });
  else
    run_guarded(call, [&] { allreduce_recursive_doubling(call, recv, count, type, op); });
  if (op == ReduceOp::avg) finish_avg(recv, count, type, call.size);
}

void Collectives::broadcast(void* data, std::size_t count, DataType type, int root) {
  Call call = begin("broadcast");
  const std::size_t bytes = checked_bytes(call, count, type);
  check_root(call, root);
  check_buffer(call, data, bytes, "data");
  if (call.size == 1) return;
  if (bytes <= shared_slot_payload && (placement() & shares_memory) != 0) {
    const std::uint64_t seq = ++shared_calls_;
    run_guarded(call, [&] { broadcast_shared(call, shared_areas_, seq, data, bytes, root); });
    return;
  }
  run_guarded(call, [&] { broadcast_binomial(call, data, bytes, root); });
}

void Collectives::reduce(const void* send, void* recv, std::size_t count, DataType type,
                         ReduceOp op, int root) {
  Call call = begin("reduce");
  const std::size_t bytes = checked_bytes(call, count, type);
  if (const auto why = unsupported(type, op); !why.empty()) usage(call, why);
  check_root(call, root);
  check_buffer(call, send, bytes, "send");
  if (call.rank == root) check_buffer(call, recv, bytes, "receive");
  if (call.size > 1 && bytes <= shared_allreduce_bytes_ && (placement() & shares_memory) != 0) {
    const std::uint64_t seq = ++shared_calls_;
    run_guarded(
        call, [&] { reduce_shared(call, shared_areas_, seq, send, recv, count, type, op, root); });
    return;
  }
  // The tree reduces in place: the root works in its receive buffer, the others in a copy.
  std::vector<char> scratch;
  void* work = recv;
  if (call.rank != root) {
    scratch.assign(static_cast<const char*>(send), static_cast<const char*>(send) + bytes);
    work = scratch.data();
  } else if (send != recv && bytes > 0) {
    std::memcpy(recv, send, bytes);
  }
  if (call.size > 1) run_guarded(call, [&] { reduce_binomial(call, work, count, type, op, root); });
  if (call.rank == root && op == ReduceOp::avg) finish_avg(recv, count, type, call.size);
}

void Collectives::allgather(const void* send, void* recv, std::size_t count, DataType type) {
  Call call = begin("allgather");
  const std::size_t block = checked_bytes(call, count, type);
  check_buffer(call, send, block, "send");
  check_buffer(call, recv, block, "receive");
  if (call.size > 1 && block <= shared_slot_payload && (placement() & shares_memory) != 0) {
    const std::uint64_t seq = ++shared_calls_;
    run_guarded(call, [&] { allgather_shared(call, shared_areas_, seq, send, recv, block); });
    return;
  }
  char* mine = static_cast<char*>(recv) + static_cast<std::size_t>(call.rank) * block;
  if (send != mine && block > 0) std::memcpy(mine, send, block);
  if (call.size > 1)
    run_guarded(call, [&] { allgather_ring(call, recv, Blocks::uniform(call.size, block)); });
}

void Collectives::allgatherv(const void* send, std::size_t send_count, void* recv,
                             std::span<const std::size_t> recv_counts,
                             std::span<const std::size_t> displs, DataType type) {
  Call call = begin("allgatherv");
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
  if (send != mine && bytes > 0) std::memcpy(mine, send, bytes);
  if (call.size > 1) run_guarded(call, [&] { allgather_ring(call, recv, blocks); });
}

void Collectives::reduce_scatter(const void* send, void* recv, std::size_t count, DataType type,
                                 ReduceOp op) {
  Call call = begin("reduce_scatter");
  const std::size_t block = checked_bytes(call, count, type);
  if (const auto why = unsupported(type, op); !why.empty()) usage(call, why);
  check_buffer(call, send, block, "send");
  check_buffer(call, recv, block, "receive");
  const std::size_t all = block * static_cast<std::size_t>(call.size);
  std::vector<char> work(static_cast<const char*>(send), static_cast<const char*>(send) + all);
  if (call.size > 1)
    run_guarded(call, [&] { reduce_scatter_ring(call, work.data(), count, type, op); });
  if (block > 0)
    std::memcpy(recv, work.data() + static_cast<std::size_t>(call.rank) * block, block);
  if (op == ReduceOp::avg) finish_avg(recv, count, type, call.size);
}

void Collectives::gather(const void* send, void* recv, std::size_t count, DataType type, int root) {
  Call call = begin("gather");
  const std::size_t block = checked_bytes(call, count, type);
  check_root(call, root);
  check_buffer(call, send, block, "send");
  if (call.rank == root) check_buffer(call, recv, block, "receive");
  run_guarded(call, [&] {
    gather_linear(call, send, block, recv, Blocks::uniform(call.size, block), root);
  });
}

void Collectives::gatherv(const void* send, std::size_t send_count, void* recv,
                          std::span<const std::size_t> recv_counts,
                          std::span<const std::size_t> displs, DataType type, int root) {
  Call call = begin("gatherv");
  const std::size_t bytes = checked_bytes(call, send_count, type);
  check_root(call, root);
  check_buffer(call, send, bytes, "send");
  const Blocks blocks = root_blocks(call, recv_counts, displs, type, bytes, recv, "receive", root);
  run_guarded(call, [&] { gather_linear(call, send, bytes, recv, blocks, root); });
}

void Collectives::scatter(const void* send, void* recv, std::size_t count, DataType type,
                          int root) {
  Call call = begin("scatter");
  const std::size_t block = checked_bytes(call, count, type);
  check_root(call, root);
  if (call.rank == root) check_buffer(call, send, block, "send");
  check_buffer(call, recv, block, "receive");
  run_guarded(call, [&] {
    scatter_linear(call, send, Blocks::uniform(call.size, block), recv, block, root);
  });
}

void Collectives::scatterv(const void* send, std::span<const std::size_t> send_counts,
                           std::span<const std::size_t> displs, void* recv, std::size_t recv_count,
                           DataType type, int root) {
  Call call = begin("scatterv");
  const std::size_t bytes = checked_bytes(call, recv_count, type);
  check_root(call, root);
  check_buffer(call, recv, bytes, "receive");
  const Blocks blocks = root_blocks(call, send_counts, displs, type, bytes, send, "send", root);
  run_guarded(call, [&] { scatter_linear(call, send, blocks, recv, bytes, root); });
}

void Collectives::alltoall(const void* send, void* recv, std::size_t count, DataType type) {
  Call call = begin("alltoall");
  const std::size_t block = checked_bytes(call, count, type);
  check_buffer(call, send, block, "send");
  check_buffer(call, recv, block, "receive");
  if (send == recv && block > 0) usage(call, "alltoall cannot run in place");
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
  run_guarded(call, [&] { alltoall_pairwise(call, send, sblocks, recv, rblocks); });
}

void Collectives::barrier() {
  Call call = begin("barrier");
  if (call.size > 1 && (placement() & shares_memory) != 0) {
    const std::uint64_t seq = ++shared_calls_;
    run_guarded(call, [&] { barrier_shared(call, shared_areas_, seq); });
    return;
  }
  run_guarded(call, [&] { barrier_dissemination(call); });
}

}  // namespace anview::collectives
