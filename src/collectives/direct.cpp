#include "collectives/direct.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

#include "collectives/reduce.hpp"
#include "collectives/steps.hpp"

namespace anview::collectives {
namespace {

// Peers' data is read and reduced this much at a time: large enough to amortise the system call
// and page pinning of a cross-memory read, small enough to stay in L2 for the reduction.
constexpr std::size_t read_unit_bytes = 256 * 1024;

constexpr std::uint32_t posting_magic = 0x50444e41;  // "ANDP", version 1

enum class Kind : std::uint32_t { allreduce = 1 };

// What a rank tells its peers at the start of a direct call (sent as raw bytes between
// processes of the same host, built from the same binary interface).
struct Posting {
  std::uint32_t magic = posting_magic;
  Kind kind = Kind::allreduce;
  std::uint64_t count = 0;
  std::uint32_t type = 0;
  std::uint32_t op = 0;
  std::int32_t root = -1;
  std::uint32_t reserved = 0;
  std::uint64_t send = 0;  // buffer addresses in the rank's process
  std::uint64_t recv = 0;
};

std::string describe(const Posting& p) {
  std::string text = "count " + std::to_string(p.count) + " of " +
                     std::string(name_of(static_cast<DataType>(p.type)));
  if (p.kind == Kind::allreduce) text += ", " + std::string(name_of(static_cast<ReduceOp>(p.op)));
  if (p.root >= 0) text += ", root " + std::to_string(p.root);
  return text;
}

// Sends `mine` to every peer and receives theirs; raises a usage Error naming the first peer
// called with other arguments.
std::vector<Posting> exchange_postings(Call& call, const Posting& mine) {
  std::vector<Posting> theirs(static_cast<std::size_t>(call.size));
  std::vector<RequestPtr> recvs(static_cast<std::size_t>(call.size));
  for (int p = 0; p < call.size; ++p)
    if (p != call.rank)
      recvs[static_cast<std::size_t>(p)] =
          post_recv(call, &theirs[static_cast<std::size_t>(p)], sizeof(Posting), p);
  std::vector<RequestPtr> sends;
  for (int p = 0; p < call.size; ++p)
    if (p != call.rank) sends.push_back(post_send(call, &mine, sizeof(Posting), p));
  // Every posting is in before any is judged, so a call that fails here leaves no message of
  // it behind and the communicator goes on with the next call.
  for (const auto& s : sends) wait(call, s);
  for (int p = 0; p < call.size; ++p) {
    if (p == call.rank) continue;
    const auto& r = recvs[static_cast<std::size_t>(p)];
    wait(call, r);
    check_size(call, r, sizeof(Posting), p);
  }
  for (int p = 0; p < call.size; ++p) {
    if (p == call.rank) continue;
    const Posting& other = theirs[static_cast<std::size_t>(p)];
    if (other.magic != posting_magic) {
      throw Error(ErrorKind::protocol,
                  {.rank = call.rank,
                   .peer = p,
                   .operation = call.operation(),
                   .cause = "rank " + std::to_string(p) +
                            " sent no valid direct-collective posting (another Anview version, "
                            "or another collective at this point of the program?)"});
    }
    if (other.kind != mine.kind || other.count != mine.count || other.type != mine.type ||
        other.op != mine.op || other.root != mine.root) {
      throw Error(ErrorKind::usage,
                  {.rank = call.rank,
                   .peer = p,
                   .operation = call.operation(),
                   .cause = "rank " + std::to_string(p) + " called it with " + describe(other) +
                            ", rank " + std::to_string(call.rank) + " with " + describe(mine) +
                            ": every rank must call each collective with the same arguments"});
    }
  }
  return theirs;
}

// Reads from a peer's memory; a peer that offered memory we cannot read has its link closed.
void read_peer(Call& call, const PeerMemories& peers, int p, std::uint64_t remote, void* local,
               std::size_t bytes) {
  try {
    peers[static_cast<std::size_t>(p)]->read(remote, local, bytes, call.operation());
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::protocol) call.messenger.fail_peer(p, e);
    throw;
  }
}

// A zero-byte message to every peer, then one from each, handed to `on_arrival` in the order
// rank+1, rank+2, ... (so the ranks do not all start with the same peer).
template <typename OnArrival>
void signal_all(Call& call, OnArrival&& on_arrival) {
  std::vector<RequestPtr> recvs(static_cast<std::size_t>(call.size));
  for (int i = 1; i < call.size; ++i) {
    const int p = mod(call.rank + i, call.size);
    recvs[static_cast<std::size_t>(p)] = post_recv(call, nullptr, 0, p);
  }
  std::vector<RequestPtr> sends;
  for (int i = 1; i < call.size; ++i)
    sends.push_back(post_send(call, nullptr, 0, mod(call.rank + i, call.size)));
  for (int i = 1; i < call.size; ++i) {
    const int p = mod(call.rank + i, call.size);
    const auto& r = recvs[static_cast<std::size_t>(p)];
    wait(call, r);
    check_size(call, r, 0, p);
    on_arrival(p);
  }
  for (const auto& s : sends) wait(call, s);
}

}  // namespace

void allreduce_direct(Call& call, const PeerMemories& peers, const void* send, void* recv,
                      std::size_t count, DataType type, ReduceOp op) {
  const std::size_t esize = size_of(type);
  const Posting mine{.kind = Kind::allreduce,
                     .count = count,
                     .type = static_cast<std::uint32_t>(type),
                     .op = static_cast<std::uint32_t>(op),
                     .send = reinterpret_cast<std::uintptr_t>(send),
                     .recv = reinterpret_cast<std::uintptr_t>(recv)};
  const std::vector<Posting> theirs = exchange_postings(call, mine);

  // 1. Reduce this rank's segment from every rank's send buffer, a cache-sized chunk at a time.
  const Segment own = segment(count, call.size, call.rank);
  const char* in = static_cast<const char*>(send) + own.offset * esize;
  char* out = static_cast<char*>(recv) + own.offset * esize;
  const std::size_t per_chunk = read_unit_bytes / esize;
  char* scratch = call.scratch_bytes(std::min(per_chunk, own.count) * esize);
  for (std::size_t k = 0; k < own.count; k += per_chunk) {
    const std::size_t m = std::min(per_chunk, own.count - k);
    const char* acc = in + k * esize;
    for (int i = 1; i < call.size; ++i) {
      const int p = mod(call.rank + i, call.size);
      read_peer(call, peers, p, theirs[static_cast<std::size_t>(p)].send + (own.offset + k) * esize,
                scratch, m * esize);
      reduce_to(out + k * esize, acc, scratch, m, type, op);
      acc = out + k * esize;
    }
  }
  if (op == ReduceOp::avg) finish_avg(out, own.count, type, call.size);

  // 2. Once a peer's segment is reduced ("ready"), copy it from its receive buffer.
  signal_all(call, [&](int p) {
    const Segment seg = segment(count, call.size, p);
    if (seg.count == 0) return;
    read_peer(call, peers, p, theirs[static_cast<std::size_t>(p)].recv + seg.offset * esize,
              static_cast<char*>(recv) + seg.offset * esize, seg.count * esize);
  });

  // 3. Nobody leaves while a peer may still read its receive buffer ("done").
  signal_all(call, [](int) {});
}

}  // namespace anview::collectives
