#include "collectives/shared.hpp"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>

#include "base/clock.hpp"
#include "collectives/reduce.hpp"
#include "collectives/steps.hpp"

namespace anview::collectives {
namespace {

enum class SlotOp : std::uint8_t {
  allreduce = 1,
  broadcast = 2,
  barrier = 3,
  allgather = 4,
  reduce = 5
};

// Payloads up to this size travel in the header's cache line: a peer that sees the flag has
// the data too (one cache-line transfer per small call, not two).
constexpr std::size_t inline_payload = 32;

// What a call was, for the mismatch check: the same on every rank of a correct program.
// `call` is the communicator's collective call number (Call::seq, its low 32 bits): a rank whose
// call failed its own argument checks took a call number but no shared one, and its next call
// must not pass for the call its peers are in (it did when the two had the same arguments: each
// reduced the other's different call, and every later call paired with the wrong one).
struct CallShape {
  std::uint64_t count;
  std::uint32_t call;
  SlotOp kind;
  std::uint8_t type;
  std::uint8_t op;
  std::uint8_t reserved;
  std::int32_t root;
  bool operator==(const CallShape&) const = default;
};

// The first cache line of a slot; a larger payload follows it.
struct alignas(64) SlotHeader {
  // The call whose contribution the slot holds (0: none yet, or its shape being rewritten).
  std::atomic<std::uint64_t> seq;
  CallShape shape;
  unsigned char small[inline_payload];
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "flags shared between processes");
static_assert(sizeof(SlotHeader) == 64);
static_assert(offsetof(SlotHeader, shape) == 8 && sizeof(CallShape) == 24);
static_assert(offsetof(SlotHeader, small) == 64 - inline_payload);

// A shape is written and read field by field as atomics: a rank may read a peer's line of an
// earlier call while the peer rewrites it for a later one (Slots::check_past(), which tells by
// `seq` whether what it read holds). The writer sets `seq` to 0 first and stores each field
// with release, the reader loads each with acquire and then `seq` again: a reader that saw a
// new field sees the 0 too. (Fences would do it with relaxed fields, but GCC's ThreadSanitizer
// does not support them; on x86 both are plain moves.)
template <typename T>
T load_acquire(const T& field) {
  return std::atomic_ref<T>(const_cast<T&>(field)).load(std::memory_order_acquire);
}
template <typename T>
void store_release(T& field, T value) {
  std::atomic_ref<T>(field).store(value, std::memory_order_release);
}
CallShape load_shape(const CallShape& s) {
  return {load_acquire(s.count), load_acquire(s.call), load_acquire(s.kind),
          load_acquire(s.type),  load_acquire(s.op),   0,
          load_acquire(s.root)};
}
void store_shape(CallShape& to, const CallShape& s) {
  store_release(to.count, s.count);
  store_release(to.call, s.call);
  store_release(to.kind, s.kind);
  store_release(to.type, s.type);
  store_release(to.op, s.op);
  store_release(to.root, s.root);
}

// The first cache line of an area; the two slots follow it.
struct alignas(64) AreaHeader {
  // The last shared call this rank gave up on (its last number): it reads none of its peers'
  // slots of that call or before any more. A call that ends well says so by the next one it
  // publishes; one that fails may skip numbers, and says it here.
  std::atomic<std::uint64_t> finished;
  // Why, written before `finished`: the kind of the error and the rank it named, so a peer that
  // comes late fails at once with the cause (a lost rank is named as lost by every survivor,
  // whichever of them noticed first).
  std::atomic<std::uint32_t> blamed_kind;
  std::atomic<std::int32_t> blamed;
};
static_assert(sizeof(AreaHeader) == 64);

// Tells the CPU this is a spin-wait (saves power, and the sibling hyperthread gets the core).
inline void spin_pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Starts taking `line` for writing (PREFETCHW; a no-op on x86 CPUs that lack it, which
// decode it as a NOP). Only a hint: nothing is written.
inline void prefetch_for_write(const void* line) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(line)));
#else
  __builtin_prefetch(line, 1, 3);
#endif
}

// An area: its AreaHeader, then a ring of call headers (call s in line s % header_ring), a ring
// as long of payloads up to ring_payload bytes (s's in entry s % header_ring), then two
// payload slots for larger ones (s's in slot s % 2). A ring entry is written again
// header_ring calls later: a rank that reads nothing (a broadcast's root) runs up to that many
// calls ahead of a reader, and learns how far the readers got once in so many calls instead of
// once a call (the cache line it reads from each peer, which that peer then takes back to
// publish, was half of an 8-byte broadcast's time; a 256-byte one took 0.37 us with the ring
// of headers alone, 0.27 with two slots).
constexpr std::uint64_t header_ring = 16;
// A rank that waits this long for a peer to get half a ring further (claim()) settles for the
// one call it needs.
constexpr auto enough_after = std::chrono::milliseconds(1);
constexpr std::size_t ring_payload = 4096;
constexpr std::size_t headers_at = sizeof(AreaHeader);
constexpr std::size_t ring_payloads_at = headers_at + header_ring * sizeof(SlotHeader);
constexpr std::size_t payloads_at = ring_payloads_at + header_ring * ring_payload;
static_assert(payloads_at % 64 == 0);

enum class Place : std::uint8_t { inline_header, ring, slot };  // where a call's payload lies

const char* kind_name(SlotOp k) {
  switch (k) {
    case SlotOp::allreduce:
      return "allreduce";
    case SlotOp::broadcast:
      return "broadcast";
    case SlotOp::barrier:
      return "barrier";
    case SlotOp::allgather:
      return "allgather";
    case SlotOp::reduce:
      return "reduce";
  }
  return "an unknown collective";
}

// What a mismatch error adds to the two calls it names.
constexpr char mismatch_rule[] =
    ": every rank must make the same collective calls, in the same order, with the same arguments";

// What a slot says about its call, for error messages.
std::string describe(const CallShape& h) {
  std::string text = kind_name(h.kind);
  if (h.kind != SlotOp::barrier) {
    text.append(" of ").append(std::to_string(h.count)).append(" ");
    text.append(name_of(static_cast<DataType>(h.type)));
  }
  if (h.kind == SlotOp::allreduce || h.kind == SlotOp::reduce)
    text.append(" ").append(name_of(static_cast<ReduceOp>(h.op)));
  if (h.kind == SlotOp::broadcast || h.kind == SlotOp::reduce)
    text.append(h.kind == SlotOp::broadcast ? " from root " : " to root ")
        .append(std::to_string(h.root));
  return text.append(" as its collective call #").append(std::to_string(h.call));
}

const AreaHeader& area_header(const char* area) {
  return *reinterpret_cast<const AreaHeader*>(area);
}

// Runs `body`, a shared call; where it fails, says in this rank's area why (the error's kind
// and the rank it names) and that this rank is done with the peers' slots up to shared call
// `last` (read then: a call may take fewer numbers than it reserved). A try block, not a
// destructor that asks std::uncaught_exceptions(): free unless it throws.
template <typename Body>
void finishing(const SharedAreas& areas, const std::uint64_t& last, Body&& body) {
  auto& own = *reinterpret_cast<AreaHeader*>(areas.own);
  auto give_up = [&](ErrorKind kind, int blamed) {
    own.blamed_kind.store(static_cast<std::uint32_t>(kind), std::memory_order_relaxed);
    own.blamed.store(blamed, std::memory_order_relaxed);
    own.finished.store(last, std::memory_order_release);
  };
  try {
    body();
  } catch (const Error& e) {
    give_up(e.kind(), e.context().peer);
    throw;
  } catch (...) {
    give_up(ErrorKind::internal, -1);
    throw;
  }
}

class Slots {
 public:
  // `payload_bytes`: what the call publishes per rank, at most (where the payload lies).
  Slots(Call& call, const SharedAreas& areas, std::uint64_t seq, std::size_t payload_bytes)
      : call_(call),
        areas_(areas),
        seq_(seq),
        place_(payload_bytes <= inline_payload ? Place::inline_header
               : payload_bytes <= ring_payload ? Place::ring
                                               : Place::slot) {}

  // This rank's payload of this call, to fill before publish().
  char* own_payload() {
    claim();
    return const_cast<char*>(payload(call_.rank));
  }

  // Writes this rank's contribution (`bytes` of `data`, if any, else what own_payload() holds)
  // and raises its flag.
  void publish(SlotOp kind, const void* data, std::size_t bytes, std::uint64_t count, DataType type,
               ReduceOp op, int root) {
    claim();
    if (bytes > 0) std::memcpy(const_cast<char*>(payload(call_.rank)), data, bytes);
    auto* h = const_cast<SlotHeader*>(header(call_.rank));
    // The line's old call is no longer there for a peer that checks it (check_past()).
    h->seq.store(0, std::memory_order_relaxed);
    store_shape(h->shape,
                {count, static_cast<std::uint32_t>(call_.seq), kind,
                 static_cast<std::uint8_t>(type), static_cast<std::uint8_t>(op), 0, root});
    h->seq.store(seq_, std::memory_order_release);
    mine_ = h;
    // The line of this rank's next call, asked for writing now: a peer that read it last
    // ring holds a copy, and taking it back is a cross-core round trip. Asked for at the
    // write itself, the stores behind it (the call's bookkeeping) wait for it; an 8-byte
    // broadcast's root spent most of its time stalled there.
    prefetch_for_write(header(call_.rank, seq_ + 1));
  }

  // Waits until every peer published this call, and checks it was called like this rank.
  void wait_all() {
    for (int i = 1; i < call_.size; ++i) wait_for(mod(call_.rank + i, call_.size));
  }

  // Waits until `peer` published this call (and checks it was called like this rank).
  void wait_for(int peer) {
    wait_until(
        peer, [&] { return published(peer); }, "did not reach the call",
        "its part of the call has not arrived");
    std::uint64_t& seen = areas_.seen[static_cast<std::size_t>(peer)];
    seen = std::max(seen, seq_);
    // The calls since this rank last compared shapes with the peer, read by neither side of
    // the pair (this rank a broadcast's root, say): their lines may still be there.
    std::uint64_t& checked = areas_.checked[static_cast<std::size_t>(peer)];
    if (checked + 1 < seq_) check_skipped(peer, checked);
    checked = std::max(checked, seq_);
  }

  // Rank r's payload of this call (this rank's too: its own slot).
  const char* payload(int r) const {
    switch (place_) {
      case Place::inline_header:
        return reinterpret_cast<const char*>(header(r)) + offsetof(SlotHeader, small);
      case Place::ring:
        return area(r) + ring_payloads_at + (seq_ % header_ring) * ring_payload;
      case Place::slot:
        break;
    }
    return area(r) + payloads_at + (seq_ % 2) * shared_slot_payload;
  }

 private:
  const char* area(int r) const {
    return r == call_.rank ? areas_.own : areas_.peers[static_cast<std::size_t>(r)];
  }
  // Rank r's header line of call `seq`.
  const SlotHeader* header(int r, std::uint64_t seq) const {
    return reinterpret_cast<const SlotHeader*>(area(r) + headers_at +
                                               (seq % header_ring) * sizeof(SlotHeader));
  }
  const SlotHeader* header(int r) const { return header(r, seq_); }

  // Before this rank writes its header line and ring entry (last used by call
  // seq - header_ring) or, for a larger payload, its payload slot (by seq - 2 at the latest),
  // waits until every peer is done with those calls: a peer that published the call after
  // them is (calls run in order), and so is one that gave up on that one (`finished`). Known
  // without a look while this rank saw the peer publish as much (areas_.seen); else (it reads
  // nothing from that peer: a broadcast's root, say) it looks at the peer's header line of
  // that call, and learns what the peer has published since, up to the line's number.
  void claim() {
    if (claimed_) return;
    claimed_ = true;
    const std::uint64_t reuse = place_ == Place::slot ? 2 : header_ring;  // since the last use
    if (seq_ <= reuse) return;
    const std::uint64_t needed = seq_ - reuse + 1;  // what each peer must have published
    for (int i = 1; i < call_.size; ++i) {
      const int peer = mod(call_.rank + i, call_.size);
      std::uint64_t& seen = areas_.seen[static_cast<std::size_t>(peer)];
      if (seen < needed) look(peer, needed);
    }
  }

  // claim()'s look at `peer`, which this rank has not seen publish `needed` (out of line: a
  // call that waited for its peers never gets here).
  [[gnu::noinline]] void look(int peer, std::uint64_t needed) {
    std::uint64_t& seen = areas_.seen[static_cast<std::size_t>(peer)];
    // A look takes a line the peer wrote: a blocking cross-core miss. It looks half a ring
    // ahead first: a peer that got that far is then known done for the next header_ring / 2
    // calls (two ranks in lockstep after a barrier: the root looked at every call). Where
    // the peer had not, the next 8 looks go straight to `needed` (a root far ahead of its
    // readers would otherwise miss twice per look).
    std::uint8_t& skip = areas_.skip_ahead[static_cast<std::size_t>(peer)];
    const std::uint64_t ahead = std::min(needed + header_ring / 2 - 1, seq_ - 1);
    if (ahead > needed && skip == 0) {  // (a payload slot's reuse has the one line to look at)
      if (const auto now = header(peer, ahead)->seq.load(std::memory_order_acquire); now >= ahead) {
        seen = std::max(seen, now);
        if (now == ahead) check_past(peer, ahead);
        return;
      }
      skip = 8;
    } else if (ahead > needed) {
      --skip;
    }
    if (const auto now = header(peer, needed)->seq.load(std::memory_order_acquire); now >= needed) {
      seen = std::max(seen, now);
      if (now == needed) check_past(peer, needed);
      return;
    }
    // Behind: spin until the peer is half a ring further, not one call. A rank that spins on
    // the line the peer writes next takes it from the peer at every publish; so it does once
    // in header_ring / 2 calls. (The peer reaches it: it made those calls before this one.)
    // But `needed` is all this call needs: a peer that published it is never late, however
    // long it takes to get further (a broadcast's root far ahead of a reader that works
    // between calls). Once the wait has lasted a millisecond, that ends it too.
    const std::uint64_t target = place_ == Place::slot ? needed : needed + header_ring / 2 - 1;
    const SlotHeader& line = *header(peer, target);
    const SlotHeader& first = *header(peer, needed);
    const AreaHeader& theirs = area_header(area(peer));
    wait_until(
        peer,
        [&] {
          return line.seq.load(std::memory_order_acquire) >= target ||
                 theirs.finished.load(std::memory_order_acquire) + 1 >= needed;
        },
        "did not finish the same-host collective before", "it is still reading the last call",
        [&] { return first.seq.load(std::memory_order_acquire) >= needed; });
    if (const auto far = line.seq.load(std::memory_order_acquire); far >= target) {
      seen = std::max(seen, far);
      check_past(peer, target);
    } else if (const auto near = first.seq.load(std::memory_order_acquire); near >= needed) {
      seen = std::max(seen, near);
      if (near == needed) check_past(peer, needed);
    }
  }

  // wait_for()'s check of the calls after `checked` whose lines the peer has not rewritten
  // (out of line: a run of calls that all wait for their peers never gets here).
  [[gnu::noinline]] void check_skipped(int peer, std::uint64_t checked) const {
    const std::uint64_t oldest = seq_ > header_ring ? seq_ - header_ring + 1 : 1;
    for (std::uint64_t t = std::max(checked + 1, oldest); t < seq_; ++t) check_past(peer, t);
  }

  // Compares `peer`'s shape of the earlier call `past` with this rank's, where both lines
  // still hold it. Where the ranks disagreed on the root (every rank a broadcast's root, or
  // none a reduce's), no rank read the other's line in the call itself: the mismatch shows
  // here, in a later call, and is reported as a usage Error naming the call it happened in.
  // A line being rewritten reads as another call (its `seq` is 0 meanwhile): nothing is said.
  void check_past(int peer, std::uint64_t past) const {
    const SlotHeader& mine = *header(call_.rank, past);
    if (mine.seq.load(std::memory_order_relaxed) != past) return;  // a call this rank skipped
    // A call this rank gave up on (a mismatch there is reported already).
    if (area_header(areas_.own).finished.load(std::memory_order_relaxed) >= past) return;
    const SlotHeader& theirs = *header(peer, past);
    if (theirs.seq.load(std::memory_order_acquire) != past) return;
    const CallShape shape = load_shape(theirs.shape);
    if (theirs.seq.load(std::memory_order_relaxed) != past) return;  // rewritten meanwhile
    if (shape == mine.shape) return;
    fail(ErrorKind::usage, peer,
         "rank " + std::to_string(peer) + " called " + describe(shape) +
             " as same-host collective #" + std::to_string(past) + ", rank " +
             std::to_string(call_.rank) + " " + describe(mine.shape) + mismatch_rule);
  }

  // True once `peer` published this call; raises a usage Error if it published another.
  bool published(int peer) const {
    const SlotHeader& h = *header(peer);
    const std::uint64_t seq = h.seq.load(std::memory_order_acquire);
    if (seq < seq_) return false;
    if (seq > seq_) {
      areas_.usage_in_call = seq_;
      fail(ErrorKind::usage, peer,
           "rank " + std::to_string(peer) + " is at its same-host collective #" +
               std::to_string(seq) + " where this rank is at #" + std::to_string(seq_) +
               ": the ranks did not call the same collectives");
    }
    if (h.shape != mine_->shape) {
      areas_.usage_in_call = seq_;
      fail(ErrorKind::usage, peer,
           "rank " + std::to_string(peer) + " called " + describe(h.shape) + ", rank " +
               std::to_string(call_.rank) + " " + describe(mine_->shape) + mismatch_rule);
    }
    return true;
  }

  // This rank's error in this call, naming `peer`.
  [[noreturn]] void fail(ErrorKind kind, int peer, std::string cause) const {
    throw Error(kind, {.rank = call_.rank,
                       .peer = peer,
                       .operation = call_.operation(),
                       .cause = std::move(cause)});
  }

  // `peer` gave up on this call (a later number of a staged one, or this) and will not publish
  // it: the error it met, or a timeout naming it.
  [[noreturn]] void peer_gave_up(int peer, const AreaHeader& theirs) const {
    const auto kind = static_cast<ErrorKind>(theirs.blamed_kind.load(std::memory_order_relaxed));
    const int blamed = theirs.blamed.load(std::memory_order_relaxed);
    const std::string seq = " (same-host collective #" + std::to_string(seq_) + ")";
    if (kind == ErrorKind::peer_lost && blamed >= 0 && blamed != call_.rank) {
      fail(ErrorKind::peer_lost, blamed,
           "rank " + std::to_string(peer) + " gave up on the call: it lost rank " +
               std::to_string(blamed) + seq);
    }
    fail(ErrorKind::timeout, peer,
         "rank " + std::to_string(peer) + " gave up on the call before this rank's part of it " +
             "came (" + to_string(kind) + " error naming rank " + std::to_string(blamed) + ")" +
             seq);
  }

  // Waits until `ready()`, which `peer` makes true. Spins, then yields the CPU (at once where
  // the ranks outnumber the CPUs: the peer waited for may need this one), then naps (a peer
  // that comes late costs little); drives the communicator's progress now and then (so peers
  // are served and a dead peer is noticed) and gives up when that peer is gone or at the
  // call's deadline, naming it: "rank P <late> in N ms", `stalled` for the stall report.
  // `enough`: a weaker condition that also ends the wait (and keeps it from failing), looked at
  // once the wait has lasted enough_after: a short wait still ends at `ready` only (look():
  // the far line, so that the next calls need not look again).
  template <typename Ready, typename Enough = bool (*)()>
  void wait_until(
      int peer, Ready&& ready, const char* late, const char* stalled,
      Enough&& enough = [] { return false; }) {
    // A few rounds before the first clock read (about 30 ns in a VM with kvm-clock): a small
    // call whose peer is a step behind is ready by then.
    for (int i = 0; i < 16; ++i) {
      if (ready()) return;
      spin_pause();
    }
    const auto start = base::Clock::now();
    auto next_check = start;
    StallClock stall(call_, start);
    for (unsigned round = 0;; ++round) {
      for (int i = 0; i < 64; ++i) {
        if (ready()) return;
        spin_pause();
      }
      const auto now = base::Clock::now();
      if (now < next_check) continue;
      next_check = now + std::chrono::microseconds(100);
      if (now - start >= enough_after && enough()) return;
      call_.messenger.progress();
      // The peer waited for may have published and then left (closed its communicator after
      // the job's last barrier, say): only if it had not is its goodbye a failure. Other ranks
      // that left are skipped by first_peer_failure(); one that died fails the call.
      if (auto failure = call_.messenger.peer_failure(peer)) {
        if (ready()) return;
        rethrow(call_, *failure);
      }
      if (auto failure = call_.messenger.first_peer_failure()) rethrow(call_, *failure);
      const AreaHeader& theirs = area_header(area(peer));
      if (theirs.finished.load(std::memory_order_acquire) >= seq_ && !ready())
        peer_gave_up(peer, theirs);
      const auto waited = now - start;
      if (waited >= call_.timeout) {
        fail(ErrorKind::timeout, peer,
             "rank " + std::to_string(peer) + " " + late + " in " +
                 std::to_string(call_.timeout.count()) + " ms (same-host collective #" +
                 std::to_string(seq_) + ")");
      }
      stall.check(call_.world(peer), [&] { return std::string(stalled); });
      if (waited > std::chrono::milliseconds(2))
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      else if (areas_.crowded || waited > std::chrono::microseconds(50))
        ::sched_yield();
    }
  }

  Call& call_;
  const SharedAreas& areas_;
  std::uint64_t seq_;
  Place place_;
  const SlotHeader* mine_ = nullptr;
  bool claimed_ = false;
};

}  // namespace

std::size_t shared_area_needed() {
  return payloads_at + 2 * shared_slot_payload;
}

namespace {

// Elements of each rank's segment that a stage of the staged allreduce moves: a slot holds a
// cache-line aligned part per rank (0: too many ranks for the slot).
std::size_t stage_elements(DataType type, int ranks) {
  return shared_slot_payload / static_cast<std::size_t>(ranks) / 64 * 64 / size_of(type);
}

// Above shared_whole_bytes: a reduce-scatter and an allgather through the slots, a stage at a
// time. Rank r reduces segment r (steps.hpp's segment()) of every rank's input. The slot of
// stage k (shared call first + k) holds, in part q, this rank's input for stage k of rank q's
// segment, and in its own part the reduced stage k - 1 of its segment: one flag round per
// stage, `stages` + 1 of them. The contributions are reduced in rank order and each segment
// by one rank, so every rank ends with the same bits. `reached` tells the stage under way.
void allreduce_staged(Call& call, const SharedAreas& areas, std::uint64_t first,
                      std::uint64_t stages, std::uint64_t& reached, const void* send, void* recv,
                      std::size_t count, DataType type, ReduceOp op) {
  const int n = call.size;
  const std::size_t esize = size_of(type);
  const std::size_t per = stage_elements(type, n);
  const std::size_t part = per * esize;
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  // The elements of rank r's segment that stage k covers (none past its end).
  auto stage = [&](int r, std::uint64_t k) {
    const Segment s = segment(count, n, r);
    const std::size_t begin = std::min<std::size_t>(s.count, k * per);
    return Segment{s.offset + begin, std::min(per, s.count - begin)};
  };
  auto part_of = [&](auto* payload, int r) { return payload + static_cast<std::size_t>(r) * part; };
  for (std::uint64_t k = 0; k <= stages; reached = ++k) {
    Slots slots(call, areas, first + k, shared_slot_payload);
    char* mine = slots.own_payload();
    if (k > 0) {
      const Segment done = stage(call.rank, k - 1);
      std::memcpy(part_of(mine, call.rank), out + done.offset * esize, done.count * esize);
    }
    for (int q = 0; q < n && k < stages; ++q) {
      const Segment s = stage(q, k);
      if (q != call.rank && s.count > 0)
        std::memcpy(part_of(mine, q), in + s.offset * esize, s.count * esize);
    }
    slots.publish(SlotOp::allreduce, nullptr, 0, count, type, op, -1);
    slots.wait_all();
    for (int q = 0; q < n && k > 0; ++q) {
      const Segment s = stage(q, k - 1);
      if (q != call.rank && s.count > 0)
        std::memcpy(out + s.offset * esize, part_of(slots.payload(q), q), s.count * esize);
    }
    if (k == stages) break;
    const Segment own = stage(call.rank, k);
    if (own.count == 0) continue;
    char* to = out + own.offset * esize;
    auto contribution = [&](int r) {
      return r == call.rank ? in + own.offset * esize : part_of(slots.payload(r), call.rank);
    };
    // Into the receive buffer; the next stage copies it into the slot (a copy into lines a
    // peer has read costs half what the reduction's own stores into them do, at 1-4 MiB). In
    // place, a rank after the second would overwrite its input with the sum of the first two
    // before adding it: a scratch buffer takes the sum there.
    const bool clobbers = to == contribution(call.rank) && call.rank >= 2;
    char* acc = clobbers ? call.scratch_bytes(part) : to;
    reduce_to(acc, contribution(0), contribution(1), own.count, type, op);
    for (int r = 2; r < n; ++r) reduce_into(acc, contribution(r), own.count, type, op);
    if (op == ReduceOp::avg) finish_avg(acc, own.count, type, n);
    if (clobbers) std::memcpy(to, acc, own.count * esize);
  }
}

}  // namespace

void allreduce_shared(Call& call, const SharedAreas& areas, std::uint64_t& calls, const void* send,
                      void* recv, std::size_t count, DataType type, ReduceOp op) {
  const std::size_t bytes = count * size_of(type);
  const std::uint64_t seq = ++calls;
  if (bytes > shared_whole_bytes) {
    const std::size_t per = stage_elements(type, call.size);
    if (per == 0) {  // the tuner and ANVIEW_ALGO refuse it before
      throw Error(ErrorKind::usage, {.rank = call.rank,
                                     .operation = call.operation(),
                                     .cause = "allreduce=shared needs a cache line of a slot per "
                                              "rank: " +
                                              std::to_string(call.size) + " ranks are too many"});
    }
    const std::uint64_t stages = (segment(count, call.size, 0).count + per - 1) / per;
    calls += stages;
    finishing(areas, calls, [&] {
      std::uint64_t reached = 0;
      try {
        allreduce_staged(call, areas, seq, stages, reached, send, recv, count, type, op);
      } catch (const Error& e) {
        // (Not for a mismatch of an earlier call, found here by one rank only: check_past().)
        if (e.kind() == ErrorKind::usage && reached == 0 && areas.usage_in_call == seq) calls = seq;
        throw;
      }
    });
    return;
  }
  finishing(areas, seq, [&] {
    Slots slots(call, areas, seq, bytes);
    slots.publish(SlotOp::allreduce, send, bytes, count, type, op, -1);
    slots.wait_all();
    reduce_to(recv, slots.payload(0), slots.payload(1), count, type, op);
    for (int r = 2; r < call.size; ++r) reduce_into(recv, slots.payload(r), count, type, op);
    if (op == ReduceOp::avg) finish_avg(recv, count, type, call.size);
  });
}

void reduce_shared(Call& call, const SharedAreas& areas, std::uint64_t seq, const void* send,
                   void* recv, std::size_t count, DataType type, ReduceOp op, int root) {
  const std::size_t bytes = count * size_of(type);
  finishing(areas, seq, [&] {
    Slots slots(call, areas, seq, bytes);
    slots.publish(SlotOp::reduce, send, bytes, count, type, op, root);
    if (call.rank != root) return;  // the root reads the slot, maybe after this rank returned
    slots.wait_all();
    reduce_to(recv, slots.payload(0), slots.payload(1), count, type, op);
    for (int r = 2; r < call.size; ++r) reduce_into(recv, slots.payload(r), count, type, op);
    if (op == ReduceOp::avg) finish_avg(recv, count, type, call.size);
  });
}

void allgather_shared(Call& call, const SharedAreas& areas, std::uint64_t seq, const void* send,
                      void* recv, std::size_t block) {
  finishing(areas, seq, [&] {
    Slots slots(call, areas, seq, block);
    slots.publish(SlotOp::allgather, send, block, block, DataType::uint8, ReduceOp::sum, -1);
    slots.wait_all();
    auto* out = static_cast<char*>(recv);
    for (int r = 0; r < call.size && block > 0; ++r) {
      char* to = out + static_cast<std::size_t>(r) * block;
      if (r != call.rank || to != send) std::memcpy(to, slots.payload(r), block);
    }
  });
}

void broadcast_shared(Call& call, const SharedAreas& areas, std::uint64_t seq, void* data,
                      std::size_t bytes, int root) {
  finishing(areas, seq, [&] {
    Slots slots(call, areas, seq, bytes);
    slots.publish(SlotOp::broadcast, call.rank == root ? data : nullptr,
                  call.rank == root ? bytes : 0, bytes, DataType::uint8, ReduceOp::sum, root);
    if (call.rank == root) return;  // the others read the slot, maybe after the root returned
    slots.wait_for(root);
    if (bytes > 0) std::memcpy(data, slots.payload(root), bytes);
  });
}

void barrier_shared(Call& call, const SharedAreas& areas, std::uint64_t seq) {
  finishing(areas, seq, [&] {
    Slots slots(call, areas, seq, 0);
    slots.publish(SlotOp::barrier, nullptr, 0, 0, DataType::uint8, ReduceOp::sum, -1);
    slots.wait_all();
  });
}

}  // namespace anview::collectives
