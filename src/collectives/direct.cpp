#include "collectives/direct.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "base/clock.hpp"
#include "base/log.hpp"
#include "collectives/reduce.hpp"
#include "collectives/steps.hpp"
#include "collectives/watchdog.hpp"

namespace anview::collectives {
namespace {

// Peers' data is read and reduced this much at a time: large enough to amortise the system call
// and page pinning of a cross-memory read, small enough to stay in L2 for the reduction.
constexpr std::size_t read_unit_bytes = 256 * 1024;

constexpr std::uint32_t posting_magic = 0x32444e41;  // "AND2": version 2 (a one-byte "done")

enum class DirectOp : std::uint32_t { allreduce = 1, reduce_scatter = 2 };

// What a rank tells its peers at the start of a direct call (sent as raw bytes between
// processes of the same host, built from the same binary interface).
struct Posting {
  std::uint32_t magic = posting_magic;
  DirectOp kind = DirectOp::allreduce;
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
  text += ", " + std::string(name_of(static_cast<ReduceOp>(p.op)));
  if (p.root >= 0) text += ", root " + std::to_string(p.root);
  return text;
}

// Sends `mine` to every peer and receives theirs; raises a usage Error naming the first peer
// called with other arguments.
std::vector<Posting> exchange_postings(Call& call, const Posting& mine) try {
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
} catch (const Error& e) {
  abandon_pending(call, e);  // receives into `theirs`, sends from `mine`
  throw;
}

// After its postings, a rank sends every peer one word: go (it has every posting and takes part:
// from now on the peer may write into its receive buffer, and it leaves only after the peer's
// "done", a one-byte message that says how its part went) or no-go (it gave up before the call
// started: nobody may write into it, and it waits for nobody). A rank writes into a peer only after
// the peer's go. A word that does not come in time fails the call, but the peer may be late
// rather than gone, holding this rank's go: the word is awaited once more before the call
// ends (finish()). These messages are sent untracked (not in call.posted) from static bytes: a
// failing call must not cancel them, the peers wait for them.
enum class Word : std::uint8_t { go = 'G', no_go = 'N' };
constexpr Word go_word = Word::go;
constexpr Word no_go_word = Word::no_go;

void tell(Call& call, int p, const void* data, std::size_t bytes) {
  try {
    call.messenger.isend(data, bytes, call.world(p), call.tag, p2p::Messenger::Poster::internal);
  } catch (const Error&) {
    // Only for arguments that cannot be wrong here; the peer's failure reaches its receive.
  }
}

void tell_all(Call& call, const void* data, std::size_t bytes) {
  for (int i = 1; i < call.size; ++i) tell(call, mod(call.rank + i, call.size), data, bytes);
}

// Waits for a peer's message of `bytes` until it arrives, the peer is lost, or `deadline`:
// unlike steps::wait(), the failure of another rank does not end the wait (this peer may be
// writing into our buffers until it says otherwise). Returns the Error that ended it, if any.
std::optional<Error> await_peer(Call& call, const RequestPtr& r, std::size_t bytes, int p,
                                base::Clock::time_point deadline, StallClock& stall,
                                const char* what) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - base::Clock::now());
    try {
      call.messenger.wait(
          *r, std::clamp(left, std::chrono::milliseconds(0), std::chrono::milliseconds(200)));
      check_size(call, r, bytes, p);
      return std::nullopt;
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::timeout) return e.for_operation(call.operation(), std::nullopt);
      if (base::Clock::now() >= deadline) {
        return Error(ErrorKind::timeout,
                     {.rank = call.world(call.rank),
                      .peer = call.world(p),
                      .operation = call.operation(),
                      .cause = "rank " + std::to_string(call.world(p)) + " did not " + what +
                               " within " + std::to_string(call.timeout.count()) +
                               " ms: " + call.messenger.describe_request(*r)});
      }
      stall.check(call.world(p), [&] { return call.messenger.describe_request(*r); });
    }
  }
}

// A rank's "done" says how its part of the call went: 0, or 1 + the ErrorKind that ended it.
// A peer that failed may have left its share of this rank's result unwritten (it reduces and
// writes one segment of every rank's result): its done must fail this rank's call too, or the
// rank would return success with a part of its result missing. Static: the words outlive a
// failing call (see tell()).
constexpr std::uint8_t done_words[] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
static_assert(static_cast<std::size_t>(ErrorKind::remote) + 2 == sizeof done_words);

const std::uint8_t* done_word(const std::optional<Error>& failure) {
  return &done_words[failure ? 1 + static_cast<std::size_t>(failure->kind()) : 0];
}

// The Error a peer's failed done stands for (none for a good one).
std::optional<Error> peer_outcome(const Call& call, int p, std::uint8_t word) {
  if (word == 0) return std::nullopt;
  ErrorContext ctx{
      .rank = call.world(call.rank), .peer = call.world(p), .operation = call.operation()};
  if (word >= sizeof done_words) {
    ctx.cause = "rank " + std::to_string(call.world(p)) + " ended the call with the word " +
                std::to_string(word) + ", which is no outcome";
    return Error(ErrorKind::protocol, std::move(ctx));
  }
  // `remote`: the failure is the peer's (its kind is in the cause); this rank's own link and
  // peers are fine, and a kind such as peer_lost would say otherwise.
  const auto kind = static_cast<ErrorKind>(word - 1);
  ctx.cause = "rank " + std::to_string(call.world(p)) + " failed its part of the call (" +
              to_string(kind) + " error): its share of this rank's result is missing or incomplete";
  return Error(ErrorKind::remote, std::move(ctx));
}

// What a peer's word said: it takes part (and may write into this rank's buffers until its
// done), it does not (no-go, or it is lost), or nothing yet (its word did not come in time).
enum class Part : std::uint8_t { taking, not_taking, unheard };

// The words of the peers that were unheard, awaited once more (one more timeout at most): such
// a peer was late, not necessarily gone, and a go it says now lets it write into this rank's
// buffers like any other; `went(p)` is called for it at once. One still unheard is given up on,
// with an error logged (it may still write).
template <typename Went>
void hear_late_words(Call& call, std::vector<Part>& parts, const std::vector<RequestPtr>& words,
                     const std::vector<Word>& heard, Went&& went) {
  const auto start = base::Clock::now();
  StallClock stall(call, start);
  for (int p = 0; p < call.size; ++p) {
    const auto i = static_cast<std::size_t>(p);
    if (parts[i] != Part::unheard) continue;
    auto error = await_peer(call, words[i], sizeof(Word), p, start + call.timeout, stall,
                            "say whether it takes part (a second time)");
    if (!error) {
      parts[i] = heard[i] == Word::go ? Part::taking : Part::not_taking;
      if (parts[i] == Part::taking) went(p);
    } else if (error->kind() == ErrorKind::timeout) {
      base::log("coll", base::LogLevel::error, error->what(),
                " (if it takes part after all, it may still write into this rank's buffers)");
    } else {
      parts[i] = Part::not_taking;  // lost
    }
  }
}

// Says done (with this rank's outcome) to the peers that said go and waits for their done: no
// rank returns, even with an error, while a peer that may write into it still does. Returns the
// error to raise: `failure` if set, else the first one met (a peer's failed done included).
// `outcomes` (a byte per rank) receives the peers' words: the caller keeps it until the call's
// receives are settled (rethrow() cancels those a failure leaves pending).
std::optional<Error> finish(Call& call, std::vector<Part>& parts,
                            const std::vector<RequestPtr>& words, const std::vector<Word>& heard,
                            std::optional<Error> failure, std::vector<std::uint8_t>& outcomes) {
  std::vector<RequestPtr> dones(static_cast<std::size_t>(call.size));
  auto say_done = [&](int p) {
    dones[static_cast<std::size_t>(p)] =
        post_recv(call, &outcomes[static_cast<std::size_t>(p)], 1, p);
    tell(call, p, done_word(failure), 1);
  };
  // First to the peers that said go in time: they wait for it while late words are awaited.
  for (int p = 0; p < call.size; ++p)
    if (parts[static_cast<std::size_t>(p)] == Part::taking) say_done(p);
  if (std::find(parts.begin(), parts.end(), Part::unheard) != parts.end())
    hear_late_words(call, parts, words, heard, say_done);
  const auto start = base::Clock::now();
  StallClock stall(call, start);
  for (int p = 0; p < call.size; ++p) {
    if (parts[static_cast<std::size_t>(p)] != Part::taking) continue;
    auto error = await_peer(call, dones[static_cast<std::size_t>(p)], 1, p, start + call.timeout,
                            stall, "say it was done with this rank's buffers");
    if (failure && error && error->kind() == ErrorKind::timeout)  // its done did not come
      base::log("coll", base::LogLevel::error, error->what(),
                " (it may still write into this rank's buffers)");
    if (!error) error = peer_outcome(call, p, outcomes[static_cast<std::size_t>(p)]);
    if (error && !failure) failure = error;
  }
  return failure;
}

// Runs a direct call: postings, words, `body(theirs)` (this rank's reads and writes, given every
// rank's posting) once every peer said go, and done. Raises the call's first failure.
template <typename Body>
void run_direct(Call& call, const Posting& mine, Body&& body) {
  std::vector<Posting> theirs;
  try {
    theirs = exchange_postings(call, mine);
  } catch (const Error& e) {
    // Ranks that disagree all see it: nobody takes part, nobody waits for a word. Otherwise
    // (a rank lost or late) peers that have every posting wait for this rank's word.
    if (e.kind() != ErrorKind::usage && e.kind() != ErrorKind::protocol)
      tell_all(call, &no_go_word, sizeof no_go_word);
    throw;
  }

  std::vector<RequestPtr> words(static_cast<std::size_t>(call.size));
  std::vector<Word> heard(static_cast<std::size_t>(call.size), Word::no_go);
  for (int p = 0; p < call.size; ++p)
    if (p != call.rank)
      words[static_cast<std::size_t>(p)] =
          post_recv(call, &heard[static_cast<std::size_t>(p)], sizeof(Word), p);
  tell_all(call, &go_word, sizeof go_word);
  std::vector<Part> parts(static_cast<std::size_t>(call.size), Part::not_taking);
  std::optional<Error> failure;
  {
    const auto start = base::Clock::now();
    StallClock stall(call, start);
    for (int p = 0; p < call.size; ++p) {
      if (p == call.rank) continue;
      auto error = await_peer(call, words[static_cast<std::size_t>(p)], sizeof(Word), p,
                              start + call.timeout, stall, "say whether it takes part");
      if (error && error->kind() == ErrorKind::timeout)
        parts[static_cast<std::size_t>(p)] = Part::unheard;  // late: it may still say go
      if (!error && heard[static_cast<std::size_t>(p)] == Word::go) {
        parts[static_cast<std::size_t>(p)] = Part::taking;
      } else if (!error) {
        error = call.messenger.first_peer_failure().value_or(
            Error(ErrorKind::timeout,
                  {.rank = call.world(call.rank),
                   .peer = call.world(p),
                   .operation = call.operation(),
                   .cause = "rank " + std::to_string(call.world(p)) +
                            " gave up on the call before it started (a rank it waited for "
                            "was lost or late)"}));
      }
      if (error && !failure) failure = error;
    }
  }
  // A read or write that fails (a peer's pages unreadable, say: a protocol error) fails the
  // call, not the link: the peers that said go may be writing into this rank's buffers, and
  // only their done, which a closed link would never bring, says they stopped.
  if (!failure) {
    try {
      body(theirs);
    } catch (const Error& e) {
      failure = e;
    }
  }
  std::vector<std::uint8_t> outcomes(static_cast<std::size_t>(call.size), 0);
  if (auto error = finish(call, parts, words, heard, failure, outcomes)) {
    abandon_pending(call, *error);  // receives into `heard` and `outcomes`
    rethrow(call, *error);
  }
}

// Reduces `count` elements at offset `at` (bytes) of every rank's send buffer into `out`, a
// cache-sized chunk at a time (`own`: this rank's elements there); after each chunk, calls
// `reduced(out_chunk, offset_in_bytes, elements)`.
template <typename Reduced>
void reduce_from_peers(Call& call, const PeerMemories& peers, const std::vector<Posting>& theirs,
                       std::uint64_t at, const char* own, char* out, std::size_t count,
                       DataType type, ReduceOp op, Reduced&& reduced) {
  const std::size_t esize = size_of(type);
  const std::size_t per_chunk = read_unit_bytes / esize;
  char* scratch = call.scratch_bytes(std::min(per_chunk, count) * esize);
  for (std::size_t k = 0; k < count; k += per_chunk) {
    const std::size_t m = std::min(per_chunk, count - k);
    const char* acc = own + k * esize;
    for (int i = 1; i < call.size; ++i) {
      const int p = mod(call.rank + i, call.size);
      peers[static_cast<std::size_t>(p)]->read(
          theirs[static_cast<std::size_t>(p)].send + at + k * esize, scratch, m * esize,
          call.operation());
      reduce_to(out + k * esize, acc, scratch, m, type, op);
      acc = out + k * esize;
    }
    if (op == ReduceOp::avg) finish_avg(out + k * esize, m, type, call.size);
    reduced(out + k * esize, at + k * esize, m);
  }
}

Posting posting(DirectOp kind, std::size_t count, DataType type, ReduceOp op, const void* send,
                const void* recv) {
  return Posting{.kind = kind,
                 .count = count,
                 .type = static_cast<std::uint32_t>(type),
                 .op = static_cast<std::uint32_t>(op),
                 .send = reinterpret_cast<std::uintptr_t>(send),
                 .recv = reinterpret_cast<std::uintptr_t>(recv)};
}

}  // namespace

void allreduce_direct(Call& call, const PeerMemories& peers, const void* send, void* recv,
                      std::size_t count, DataType type, ReduceOp op) {
  const std::size_t esize = size_of(type);
  run_direct(call, posting(DirectOp::allreduce, count, type, op, send, recv),
             [&](const std::vector<Posting>& theirs) {
               // This rank's segment, reduced from every rank's send buffer; each reduced chunk
               // is written into every peer's receive buffer while it is still in cache
               // (reading it back from memory later would cost one more pass).
               const Segment own = segment(count, call.size, call.rank);
               reduce_from_peers(call, peers, theirs, own.offset * esize,
                                 static_cast<const char*>(send) + own.offset * esize,
                                 static_cast<char*>(recv) + own.offset * esize, own.count, type, op,
                                 [&](const char* chunk, std::uint64_t at, std::size_t m) {
                                   for (int i = 1; i < call.size; ++i) {
                                     const int p = mod(call.rank + i, call.size);
                                     peers[static_cast<std::size_t>(p)]->write(
                                         theirs[static_cast<std::size_t>(p)].recv + at, chunk,
                                         m * esize, call.operation());
                                   }
                                 });
             });
}

void reduce_scatter_direct(Call& call, const PeerMemories& peers, const void* send, void* recv,
                           std::size_t count, DataType type, ReduceOp op) {
  const std::size_t esize = size_of(type);
  const std::size_t block = count * esize;
  const auto* in = static_cast<const char*>(send) + static_cast<std::size_t>(call.rank) * block;
  // Peers read this rank's other blocks while it works: a receive buffer that overlaps them
  // gets the result only at the end.
  const auto* first = static_cast<const char*>(send);
  const auto* out = static_cast<char*>(recv);
  const bool overlaps =
      out != in && out < first + block * static_cast<std::size_t>(call.size) && first < out + block;
  std::vector<char> staging(overlaps ? block : 0);
  char* target = overlaps ? staging.data() : static_cast<char*>(recv);
  run_direct(call, posting(DirectOp::reduce_scatter, count, type, op, send, recv),
             [&](const std::vector<Posting>& theirs) {
               reduce_from_peers(call, peers, theirs, static_cast<std::uint64_t>(call.rank) * block,
                                 in, target, count, type, op,
                                 [](const char*, std::uint64_t, std::size_t) {});
             });
  if (overlaps && block > 0) std::memcpy(recv, staging.data(), block);
}

}  // namespace anview::collectives
