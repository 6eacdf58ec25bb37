#include "collectives/collectives.hpp"

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

const base::Setting chunk_setting(
    "collectives", "ANVIEW_COLL_CHUNK", "64K",
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

void Collectives::check_buffer(const Call& call, const void* p, std::size_t bytes,
                               const char* which) const {
  if (p == nullptr && bytes > 0) usage(call, std::string("null ") + which + " buffer");
}

bool Collectives::local_direct() const {
  if (!local_direct_) {
    peer_memories_.assign(static_cast<std::size_t>(messenger_.size()), nullptr);
    bool all = messenger_.size() > 1;
    for (int p = 0; p < messenger_.size(); ++p) {
      if (p == messenger_.rank()) continue;
      peer_memories_[static_cast<std::size_t>(p)] = messenger_.peer_memory(p);
      all = all && peer_memories_[static_cast<std::size_t>(p)] != nullptr;
    }
    local_direct_ = all;
  }
  return *local_direct_;
}

bool Collectives::agree_direct() {
  if (!direct_agreed_) {
    Call call = begin("direct agreement");
    std::int32_t all = local_direct() ? 1 : 0;
    run_guarded(
        call, [&] { allreduce_recursive_doubling(call, &all, 1, DataType::int32, ReduceOp::min); });
    direct_agreed_ = all == 1;
  }
  return *direct_agreed_;
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
  if (bytes >= direct_allreduce_bytes_ && direct_agreed_.value_or(local_direct())) {
    say(size +
        " >= ANVIEW_ALLREDUCE_DIRECT_BYTES and every rank can read its peers' memory "
        "(one host, cross-memory attach)");
    return "direct";
  }
  if (bytes > small_allreduce_bytes_) {
    say(size + " > ANVIEW_ALLREDUCE_SMALL_BYTES: bandwidth-bound" +
        (bytes >= direct_allreduce_bytes_ ? "; direct needs every rank on one host with "
                                            "cross-memory attach"
                                          : ""));
    return "ring";
  }
  say(size + " <= ANVIEW_ALLREDUCE_SMALL_BYTES: latency-bound");
  return "recursive_doubling";
}

std::string Collectives::algorithm(std::string_view collective, std::size_t bytes,
                                   std::string* why) const {
  if (collective == "allreduce") return allreduce_choice(bytes, why);
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
      forced_allreduce_ != "recursive_doubling" && forced_allreduce_ != "direct")
    usage(call, "ANVIEW_ALGO names allreduce=" + forced_allreduce_ +
                    "; known: ring, recursive_doubling, direct");
  if (call.size == 1 || count == 0) {
    if (send != recv && bytes > 0) std::memcpy(recv, send, bytes);
    return;
  }
  // Every rank reaches the same decisions: they depend on the arguments and on agreed state.
  const bool direct_candidate = forced_allreduce_ == "direct" ||
                                (forced_allreduce_.empty() && bytes >= direct_allreduce_bytes_);
  if (direct_candidate && agree_direct()) {
    run_guarded(call, [&] { allreduce_direct(call, peer_memories_, send, recv, count, type, op); });
    return;
  }
  if (forced_allreduce_ == "direct")
    usage(call,
          "ANVIEW_ALGO forces allreduce=direct, but not every rank can read its peers' memory "
          "(direct needs all ranks on one host with cross-memory attach; anview-info tells why "
          "not)");
  if (send != recv) std::memcpy(recv, send, bytes);
  // The ring needs at least one element per rank to be worth its 2(n-1) steps.
  if (allreduce_choice(bytes, nullptr) == "ring" && count >= static_cast<std::size_t>(call.size))
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
  if (call.size > 1) run_guarded(call, [&] { broadcast_binomial(call, data, bytes, root); });
}

void Collectives::reduce(const void* send, void* recv, std::size_t count, DataType type,
                         ReduceOp op, int root) {
  Call call = begin("reduce");
  const std::size_t bytes = checked_bytes(call, count, type);
  if (const auto why = unsupported(type, op); !why.empty()) usage(call, why);
  check_root(call, root);
  check_buffer(call, send, bytes, "send");
  if (call.rank == root) check_buffer(call, recv, bytes, "receive");
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
  char* mine = static_cast<char*>(recv) + static_cast<std::size_t>(call.rank) * block;
  if (send != mine && block > 0) std::memcpy(mine, send, block);
  if (call.size > 1) run_guarded(call, [&] { allgather_ring(call, recv, block); });
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
  run_guarded(call, [&] { gather_linear(call, send, recv, block, root); });
}

void Collectives::scatter(const void* send, void* recv, std::size_t count, DataType type,
                          int root) {
  Call call = begin("scatter");
  const std::size_t block = checked_bytes(call, count, type);
  check_root(call, root);
  if (call.rank == root) check_buffer(call, send, block, "send");
  check_buffer(call, recv, block, "receive");
  run_guarded(call, [&] { scatter_linear(call, send, recv, block, root); });
}

void Collectives::alltoall(const void* send, void* recv, std::size_t count, DataType type) {
  Call call = begin("alltoall");
  const std::size_t block = checked_bytes(call, count, type);
  check_buffer(call, send, block, "send");
  check_buffer(call, recv, block, "receive");
  if (send == recv && block > 0) usage(call, "alltoall cannot run in place");
  run_guarded(call, [&] { alltoall_pairwise(call, send, recv, block); });
}

void Collectives::barrier() {
  Call call = begin("barrier");
  run_guarded(call, [&] { barrier_dissemination(call); });
}

}  // namespace anview::collectives
