#include "collectives/steps.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "base/clock.hpp"
#include "collectives/reduce.hpp"

namespace anview::collectives {

[[noreturn]] void rethrow(const Call& call, const Error& e) {
  throw e.for_operation(call.operation(), std::nullopt);
}

namespace {

// How often a waiting step checks whether some rank of the communicator is gone.
constexpr auto failure_check = std::chrono::milliseconds(200);

}  // namespace

void wait(Call& call, const RequestPtr& request) {
  const auto start = base::Clock::now();
  const auto deadline = start + call.timeout;
  StallClock stall(call, start);
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - base::Clock::now());
    try {
      call.messenger.wait(*request, std::clamp(left, std::chrono::milliseconds(0), failure_check));
      return;
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::timeout) rethrow(call, e);
      if (auto failure = call.messenger.first_peer_failure()) {
        call.messenger.abandon(request, *failure);
        rethrow(call, *failure);
      }
      if (base::Clock::now() < deadline) {
        stall.check(request->peer, [&] { return call.messenger.describe_request(*request); });
        continue;
      }
      const Error timeout(
          ErrorKind::timeout,
          {.rank = call.world(call.rank),
           .peer = request->peer,
           .operation = call.operation(),
           .cause = "a step was not complete after " + std::to_string(call.timeout.count()) +
                    " ms: " + call.messenger.describe_request(*request)});
      call.messenger.abandon(request, timeout);
      throw timeout;
    }
  }
}

RequestPtr post_recv(Call& call, void* data, std::size_t bytes, int from) {
  call.posted.push_back(call.messenger.irecv(data, bytes, call.world(from), call.tag,
                                             p2p::Messenger::Poster::internal));
  return call.posted.back();
}

RequestPtr post_send(Call& call, const void* data, std::size_t bytes, int to) {
  call.posted.push_back(call.messenger.isend(data, bytes, call.world(to), call.tag,
                                             p2p::Messenger::Poster::internal));
  return call.posted.back();
}

void send(Call& call, const void* data, std::size_t bytes, int to) {
  wait(call, post_send(call, data, bytes, to));
}

void check_size(const Call& call, const RequestPtr& r, std::size_t bytes, int from) {
  if (r->status.bytes == bytes) return;
  throw Error(ErrorKind::protocol,
              {.rank = call.world(call.rank),
               .peer = call.world(from),
               .operation = call.operation(),
               .cause = "rank " + std::to_string(call.world(from)) + " sent " +
                        std::to_string(r->status.bytes) + " bytes where " + std::to_string(bytes) +
                        " were due: do all ranks call the same collectives in the same order with "
                        "the same sizes?"});
}

void recv(Call& call, void* data, std::size_t bytes, int from) {
  const RequestPtr r = post_recv(call, data, bytes, from);
  wait(call, r);
  check_size(call, r, bytes, from);
}

void sendrecv(Call& call, const void* sdata, std::size_t sbytes, int to, void* rdata,
              std::size_t rbytes, int from) {
  const RequestPtr r = post_recv(call, rdata, rbytes, from);
  const RequestPtr s = post_send(call, sdata, sbytes, to);
  wait(call, s);
  wait(call, r);
  check_size(call, r, rbytes, from);
}

Segment segment(std::size_t count, int parts, int i) {
  const std::size_t base = count / static_cast<std::size_t>(parts);
  const std::size_t extra = count % static_cast<std::size_t>(parts);
  const auto u = static_cast<std::size_t>(i);
  return {u * base + std::min(u, extra), base + (u < extra ? 1 : 0)};
}

void exchange_reduce(Call& call, const char* source, std::size_t scount, int to, const char* own,
                     char* target, std::size_t rcount, int from, DataType type, ReduceOp op,
                     std::size_t chunk_bytes) {
  // Both sides cut the same message the same way (the sender's segment is the receiver's), so
  // chunks match one to one. Every receive is posted before any send, so no chunk arrives
  // unexpected (an unexpected chunk costs an allocation and a second copy).
  const std::size_t esize = size_of(type);
  const std::size_t per_chunk = std::max<std::size_t>(chunk_bytes / esize, 1);
  const std::size_t rchunks = (rcount + per_chunk - 1) / per_chunk;
  const std::size_t schunks = (scount + per_chunk - 1) / per_chunk;
  char* incoming = call.scratch_bytes(rcount * esize);
  auto chunk_count = [&](std::size_t total, std::size_t k) {
    return std::min(per_chunk, total - k * per_chunk);
  };
  std::vector<RequestPtr> recvs(rchunks);
  for (std::size_t k = 0; k < rchunks; ++k) {
    recvs[k] =
        post_recv(call, incoming + k * per_chunk * esize, chunk_count(rcount, k) * esize, from);
  }
  std::vector<RequestPtr> sends;
  sends.reserve(schunks);
  for (std::size_t k = 0; k < schunks; ++k)
    sends.push_back(
        post_send(call, source + k * per_chunk * esize, chunk_count(scount, k) * esize, to));
  // A target that overlaps what is being sent (in place on 2 ranks, the ring's only step sends
  // block 0 and reduces into it) is written only once the sends are done with it: a send
  // queued in a full ring or offered by reference is read after it was posted.
  const auto source_at = reinterpret_cast<std::uintptr_t>(source);
  const auto target_at = reinterpret_cast<std::uintptr_t>(target);
  if (scount > 0 && rcount > 0 && target_at < source_at + scount * esize &&
      source_at < target_at + rcount * esize) {
    for (auto& r : sends) wait(call, r);
    sends.clear();
  }
  for (std::size_t k = 0; k < rchunks; ++k) {
    const std::size_t n = chunk_count(rcount, k);
    const std::size_t at = k * per_chunk * esize;
    wait(call, recvs[k]);
    check_size(call, recvs[k], n * esize, from);
    reduce_to(target + at, own + at, incoming + at, n, type, op);
  }
  for (auto& r : sends) wait(call, r);
}

PowerOfTwo fold_to_power_of_two(Call& call, const void* own, void* data, std::size_t count,
                                DataType type, ReduceOp op, char* incoming) {
  const int r = call.rank;
  const std::size_t bytes = count * size_of(type);
  PowerOfTwo p{1, 0, -1};
  while (p.pof2 * 2 <= call.size) p.pof2 *= 2;
  p.extra = call.size - p.pof2;
  if (r >= 2 * p.extra) {
    p.vrank = r - p.extra;
  } else if (r % 2 == 0) {
    send(call, own, bytes, r + 1);
  } else {
    recv(call, incoming, bytes, r - 1);
    reduce_to(data, own, incoming, count, type, op);
    p.vrank = r / 2;
  }
  return p;
}

void unfold_from_power_of_two(Call& call, const PowerOfTwo& p, void* data, std::size_t bytes) {
  const int r = call.rank;
  if (r >= 2 * p.extra) return;
  if (r % 2 == 1) {
    send(call, data, bytes, r - 1);
  } else {
    recv(call, data, bytes, r + 1);
  }
}

}  // namespace anview::collectives
