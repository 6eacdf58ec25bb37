// anview_p2p_check: process-per-rank checks of the p2p layer over real sockets.
//
//   anview-run -n N anview_p2p_check SCENARIO [--seed S] [--result-dir DIR] [--preload BYTES]
//                                     [--hosts K] [--deny-cma] [--deny-pidfd]
//
// --hosts K splits the ranks over K emulated hosts (ANVIEW_HOST_ID per rank): shm within one,
// tcp across. --deny-cma makes cross-memory attach fail (seccomp), as in a locked-down
// container: shm must pipeline large messages through its ring. Every scenario first checks
// that each peer got the transport it should.
// Scenarios (each rank runs the same one; see the function of the same name for details):
//   stress       all-to-all, random sizes 0 B .. 64 MiB, pre- and late-posted receives
//   wildcards    any_source / any_tag receives, status fields, per-(sender, tag) order
//   ordering     5000 same-tag messages in a ring, mixed eager/rendezvous, in send order
//   outstanding  10,000 isends and 10,000 irecvs outstanding per ordered pair, then wait all
//   timeout      a receive nobody sends to: timeout Error fields, timing, recovery
//   kill         rank N-1 SIGKILLs itself; survivors see peer_lost fast and carry on
//                (--result-dir: every survivor writes DIR/rank<R>.result, "OK ..." or
//                "FAIL ..."; anview-run exits non-zero because of the killed rank;
//                --preload BYTES: first flood the survivors with unreceived eager messages)
//   stop         rank N-1 SIGSTOPs itself; survivors time out on it, then it is continued
//   garbage      rank 0 sends garbage to the store port and every rank's data ports
//   tls_garbage  the same against TLS ports (ANVIEW_TLS=1): plain text, a key from another
//                secret, bad records, garbage inside a session with the job's key
//   version      hellos with a foreign job id, wrong world size, ... get the right rejects
//   idle         a rank blocked in a receive uses no CPU and wakes at once when the message comes
//   coll_kill    rank N-1 dies during a loop of allreduces; every survivor fails fast naming it
//   coll_direct  allreduce and reduce_scatter results in and out of place with the algorithms
//                placement allows (shared and direct on one host, else recursive doubling and
//                the ring); on one host, a rank called with another count or operation gets a
//                usage Error naming a peer at once
//   coll_late    a rank that gave up on a same-host allreduce (ANVIEW_ALGO's, direct or
//                shared) is not written into by a late peer, which fails at once naming it
//   coll_runahead  same-host broadcasts and reduces whose ranks that read nothing return at
//                once, with a rank now and then late: every result right, nothing overwritten
//
// Every check that fails raises Failure; main prints "anview_p2p_check SCENARIO: rank R
// FAILED: why" on stderr and exits 1. On success rank 0 prints one summary line and every
// rank exits 0.
//
// Synchronisation between phases goes through the bootstrap store (never through messages,
// so wildcard receives cannot swallow it) while driving the communicator's progress, so a
// rank waiting at a barrier still serves its peers.
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "anview/anview.hpp"
#include "base/tls.hpp"
#include "bootstrap/launch_env.hpp"
#include "bootstrap/store_protocol.hpp"
#include "collectives/reduce.hpp"
#include "transport/frame.hpp"
#include "transport/tcp/handshake.hpp"
#if defined(ANVIEW_HAVE_UCX)
#include <ucp/api/ucp.h>

#include "transport/ucx/handshake.hpp"
#endif

namespace {

using anview::Communicator;
using anview::Error;
using anview::ErrorKind;
using anview::Request;
using anview::Status;
using anview::Store;
using anview::Tag;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
// The default ANVIEW_EAGER_BYTES: messages up to this size are eager.
constexpr std::size_t eager_limit = 64 * KiB;

// ------------------------------------------------------------------------------------------
// Failures and small helpers
// ------------------------------------------------------------------------------------------

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

template <typename... Args>
void require(bool ok, const Args&... args) {
  if (!ok) throw Failure(cat(args...));
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string mib(std::uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / MiB);
  return text;
}

std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A deterministic key for one message: every rank computes the same one.
std::uint64_t message_key(std::uint64_t seed, int sender, int receiver, std::uint64_t index) {
  return splitmix(seed ^ splitmix((static_cast<std::uint64_t>(sender) << 48) ^
                                  (static_cast<std::uint64_t>(receiver) << 32) ^ index));
}

// Log-uniform in [lo, hi] (lo >= 1).
std::size_t log_uniform(std::mt19937_64& rng, std::size_t lo, std::size_t hi) {
  std::uniform_real_distribution<double> d(std::log(static_cast<double>(lo)),
                                           std::log(static_cast<double>(hi) + 1.0));
  return std::clamp<std::size_t>(static_cast<std::size_t>(std::exp(d(rng))), lo, hi);
}

// Payload source: one pseudo-random buffer every rank generates from the seed. The content of
// message `key` with n bytes is pattern[offset(key) .. offset(key) + n): different messages
// start at different (unaligned) offsets, so a message delivered in the wrong place, order or
// length does not compare equal. Many sends may point into it at once (it is never written).
class Pattern {
 public:
  Pattern(std::uint64_t seed, std::size_t max_message) : bytes_(max_message + window) {
    std::uint64_t state = seed;
    std::size_t i = 0;
    for (; i + 8 <= bytes_.size(); i += 8) {
      const std::uint64_t word = splitmix(state++);
      std::memcpy(bytes_.data() + i, &word, 8);
    }
    for (; i < bytes_.size(); ++i) bytes_[i] = static_cast<unsigned char>(splitmix(state++));
  }
  std::size_t max_message() const { return bytes_.size() - window; }
  const unsigned char* at(std::uint64_t key) const {
    return bytes_.data() + splitmix(key) % window;
  }
  // Where `data` first differs from the content of message `key`, or -1 when it matches.
  long long mismatch(const void* data, std::size_t n, std::uint64_t key) const {
    const unsigned char* want = at(key);
    if (n == 0 || std::memcmp(data, want, n) == 0) return -1;
    const auto* got = static_cast<const unsigned char*>(data);
    std::size_t i = 0;
    while (got[i] == want[i]) ++i;
    return static_cast<long long>(i);
  }

 private:
  static constexpr std::size_t window = 65536 + 13;
  std::vector<unsigned char> bytes_;
};

// An uninitialised receive buffer (the content check covers every byte the library writes).
struct Buffer {
  std::unique_ptr<unsigned char[]> data;
  std::size_t capacity = 0;
  explicit Buffer(std::size_t n = 0)
      : data(n ? std::make_unique_for_overwrite<unsigned char[]>(n) : nullptr), capacity(n) {}
};

std::string describe(const Error& e) {
  return cat("[", anview::to_string(e.kind()), "] ", e.what());
}

// Runs f and returns the anview::Error it raised, or nothing when it returned normally.
template <typename F>
std::optional<Error> error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

// Waits for a request; its Error becomes a Failure that says which message it was.
Status wait_for(Request& request, const std::string& what) {
  try {
    return request.wait();
  } catch (const Error& e) {
    throw Failure(what + ": " + describe(e));
  }
}

// ------------------------------------------------------------------------------------------
// The job: communicator, a store client of our own, barriers
// ------------------------------------------------------------------------------------------

struct Options {
  std::string scenario;
  std::uint64_t seed = 20240611;
  std::string result_dir;
  std::size_t preload_bytes = 0;  // kill only
  int hosts = 0;                  // emulate this many hosts (ANVIEW_HOST_ID per rank)
  bool deny_cma = false;          // cross-memory attach refused, as in a locked-down container
  bool deny_pidfd = false;        // pidfd_open refused, as on kernels before 5.3 or in sandboxes
};

// The transports every pair must use, from ANVIEW_TRANSPORTS and the emulated hosts: the first
// listed that reaches the peer (shm on one host only; ucx, when named, everywhere; tcp
// everywhere); with cross-memory attach denied, shm pipelines through its ring. Unset, the list
// is shm,tcp here (the default names ucx too, but it serves no one without RDMA hardware).
void check_transport_plan(Communicator& comm, const Options& options) {
  const char* env = std::getenv("ANVIEW_TRANSPORTS");
  std::vector<std::string> listed;
  std::stringstream list(env ? env : "shm,tcp");
  for (std::string item; std::getline(list, item, ',');) listed.push_back(item);
  const int me = comm.rank();
  const int n = comm.size();
  auto host = [&](int r) { return options.hosts > 0 ? r * options.hosts / n : 0; };
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    std::string expected;
    for (const auto& t : listed) {
      if (t == "ucx" || t == "tcp" || (t == "shm" && host(p) == host(me))) {
        expected = t;
        break;
      }
    }
    const std::string got = comm.transport_name(p);
    require(got == expected, "rank ", me, " reaches rank ", p, " over ", got, ", expected ",
            expected, " (", comm.describe_peer(p), ")");
    if (got == "shm" && options.deny_cma) {
      require(comm.describe_peer(p).find("pipelined through the ring") != std::string::npos,
              "cross-memory attach is denied, yet rank ", p, " is described as '",
              comm.describe_peer(p), "'");
    }
  }
}

// Makes the given system calls fail with `error` in this process, as a container's seccomp
// profile, kernel.yama.ptrace_scope or an older kernel does (x86-64 system call numbers;
// test-only). Filters stack: each call adds one.
void deny_system_calls(const std::vector<long>& calls, int error) {
  std::vector<sock_filter> filter{BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr))};
  const auto n = static_cast<std::uint8_t>(calls.size());
  for (std::uint8_t i = 0; i < n; ++i)  // a match jumps to the errno return, past the allow
    filter.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<std::uint32_t>(calls[i]),
                              static_cast<std::uint8_t>(n - i), 0));
  filter.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  filter.push_back(BPF_STMT(
      BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (static_cast<std::uint32_t>(error) & SECCOMP_RET_DATA)));
  sock_fprog program{static_cast<unsigned short>(filter.size()), filter.data()};
  require(::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
              ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0,
          "cannot install the seccomp filter: ", std::strerror(errno));
}

// process_vm_readv/writev fail with EPERM, as in a locked-down container.
void deny_cross_memory_attach() {
  deny_system_calls({SYS_process_vm_readv, SYS_process_vm_writev}, EPERM);
}

// pidfd_open fails with ENOSYS, as on kernels before 5.3 (and in sandboxes whose seccomp
// profile predates it): same-host peers cannot be watched through a pidfd.
void deny_pidfd() {
  deny_system_calls({SYS_pidfd_open}, ENOSYS);
}

class Job {
 public:
  explicit Job(const Options& options)
      : options_(options),
        comm_(Communicator::from_env()),
        store_(Store::connect_tcp(root_address(), {.rank = comm_.rank()})) {
    check_transport_plan(comm_, options_);
  }

  Communicator& comm() { return comm_; }
  Store& store() { return store_; }
  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  std::uint64_t seed() const { return options_.seed; }
  const Options& options() const { return options_; }

  static std::string root_address() {
    const char* root = std::getenv("ANVIEW_ROOT");
    require(root != nullptr && *root != '\0', "ANVIEW_ROOT is not set: run under anview-run");
    return root;
  }

  // Waits until `participants` ranks have arrived, driving progress meanwhile. Barriers are
  // numbered in call order; one that only some ranks take part in needs a `name` instead.
  void barrier(int participants, const std::string& name = {}) {
    const std::string key = cat("check/", options_.scenario, "/barrier/",
                                name.empty() ? std::to_string(barriers_++) : name);
    if (store_.add(key, 1) == participants) store_.set(key + "/done", "1");
    wait_key(key + "/done");
  }

  // Ends the job: after it only rank 0 touches the store, so rank 0 (which serves it) must
  // come last. Non-zero ranks check in after a barrier; rank 0 waits for all of them.
  void leave(int participants) {
    barrier(participants);
    if (rank() != 0) {
      if (store_.add("check/left", 1) == participants - 1) store_.set("check/left/done", "1");
    } else if (participants > 1) {
      wait_key("check/left/done");
    }
  }

  // Drives progress for a while (messages arrive, nothing is posted meanwhile).
  void progress_for(std::chrono::milliseconds duration) {
    const auto end = Clock::now() + duration;
    while (Clock::now() < end) {
      comm_.progress();
      std::this_thread::sleep_for(200us);
    }
  }

 private:
  void wait_key(const std::string& key) {
    const auto deadline = Clock::now() + 60s;
    for (int polls = 0;; ++polls) {
      comm_.progress();
      if (store_.check({key})) return;
      require(Clock::now() < deadline, "store key '", key, "' did not appear within 60 s");
      std::this_thread::sleep_for(polls < 50 ? 100us : 1ms);
    }
  }

  Options options_;
  Communicator comm_;
  Store store_;
  int barriers_ = 0;
};

// Checks one completed receive: source, tag, byte count and content.
void check_received(const Pattern& pattern, const Status& st, const Buffer& buf, int source,
                    Tag tag, std::size_t bytes, std::uint64_t key, const std::string& what) {
  require(st.source == source, what, ": status.source ", st.source, ", expected ", source);
  require(st.tag == tag, what, ": status.tag ", anview::to_underlying(st.tag), ", expected ",
          anview::to_underlying(tag));
  require(st.bytes == bytes, what, ": status.bytes ", st.bytes, ", expected ", bytes);
  const long long bad = pattern.mismatch(buf.data.get(), bytes, key);
  require(bad < 0, what, ": content differs at byte ", bad, " of ", bytes);
}

// ------------------------------------------------------------------------------------------
// stress
// ------------------------------------------------------------------------------------------

// The sizes rank `sender` sends to rank `receiver` (both sides compute them).
std::vector<std::size_t> stress_sizes(std::uint64_t seed, int sender, int receiver, int n) {
  if (sender == receiver) return {0, 1, 3, eager_limit, eager_limit + 1, MiB + 3};
  // Around every boundary: empty, tiny, odd, the eager threshold (64 KiB is still eager,
  // 64 KiB + 1 is the smallest rendezvous), the 1 MiB rendezvous chunk, multiple chunks.
  std::vector<std::size_t> sizes = {0,
                                    1,
                                    2,
                                    3,
                                    7,
                                    8,
                                    15,
                                    31,
                                    33,
                                    63,
                                    64,
                                    127,
                                    1000,
                                    1023,
                                    4095,
                                    4097,
                                    65535,
                                    eager_limit,
                                    eager_limit + 1,
                                    eager_limit + 2,
                                    128 * KiB + 1,
                                    MiB - 1,
                                    MiB,
                                    MiB + 1,
                                    3 * MiB + 5};
  // Random sizes, log-uniform over 1 B .. 64 MiB, with the random part of each pair's volume
  // capped (a draw that does not fit the rest of the budget is drawn again).
  std::mt19937_64 rng(message_key(seed, sender, receiver, 0xA11));
  std::size_t budget = 20 * MiB;
  for (int drawn = 0, tries = 0; drawn < 24 && tries < 1000; ++tries) {
    const std::size_t s = log_uniform(rng, 1, 64 * MiB);
    if (s > budget) continue;
    budget -= s;
    sizes.push_back(s);
    ++drawn;
  }
  // A few big ones, one per sender (for N = 2 and 4): the 64 MiB maximum and >= 16 MiB.
  if (receiver == (sender + 1) % n) {
    const std::size_t big[] = {64 * MiB, 16 * MiB + 1, 16 * MiB, 20 * MiB + 12345};
    if (sender < 4) sizes.push_back(big[sender]);
  }
  std::shuffle(sizes.begin(), sizes.end(), rng);
  return sizes;
}

std::string stress(Job& job) {
  const int me = job.rank();
  const int n = job.size();
  const Pattern pattern(job.seed(), 64 * MiB);
  const auto start = Clock::now();

  struct Recv {
    int source;
    std::size_t index;
    std::size_t bytes;
    Buffer buf;
    Request req;
  };
  std::vector<Recv> recvs;
  for (int src = 0; src < n; ++src) {
    const auto sizes = stress_sizes(job.seed(), src, me, n);
    for (std::size_t i = 0; i < sizes.size(); ++i)
      recvs.push_back({src, i, sizes[i], Buffer(sizes[i] + (i % 3 == 0 ? 100 : 0)), {}});
  }
  auto post = [&](Recv& r) {
    r.req = job.comm().irecv(r.buf.data.get(), r.buf.capacity, r.source, Tag{r.index});
  };
  // Even-indexed receives are posted before anything is sent; the odd ones only after the
  // messages had time to arrive (unexpected eager payloads and rendezvous announcements).
  for (auto& r : recvs)
    if (r.index % 2 == 0) post(r);
  job.barrier(n);

  std::vector<Request> sends;
  std::uint64_t sent_bytes = 0;
  for (int k = 0; k < n; ++k) {
    const int dst = (me + k) % n;
    const auto sizes = stress_sizes(job.seed(), me, dst, n);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      sends.push_back(
          job.comm().isend(pattern.at(message_key(job.seed(), me, dst, i)), sizes[i], dst, Tag{i}));
      sent_bytes += sizes[i];
    }
  }
  job.progress_for(30ms);
  for (auto& r : recvs)
    if (r.index % 2 == 1) post(r);

  std::uint64_t received_bytes = 0;
  for (auto& r : recvs) {
    const std::string what =
        cat("message ", r.index, " (", r.bytes, " bytes) from rank ", r.source);
    const Status st = wait_for(r.req, what);
    check_received(pattern, st, r.buf, r.source, Tag{r.index}, r.bytes,
                   message_key(job.seed(), r.source, me, r.index), what);
    received_bytes += r.bytes;
    r.buf = Buffer();  // free as we go
  }
  for (auto& s : sends) {
    const Status st = s.wait();
    require(st.source == me, "send status.source ", st.source);
  }
  const double secs = seconds_since(start);
  job.leave(n);
  return cat(sends.size(), " sends / ", recvs.size(), " receives on rank 0, ", mib(sent_bytes),
             " sent and ", mib(received_bytes), " received by rank 0 in ", secs, " s");
}

// ------------------------------------------------------------------------------------------
// wildcards
// ------------------------------------------------------------------------------------------

// Every message starts with this header; the rest is pattern bytes.
struct WildHeader {
  std::uint32_t sender;
  std::uint32_t tag;
  std::uint32_t seq;    // per (sender, receiver, tag), from 0
  std::uint32_t index;  // per (sender, receiver), from 0
};

struct WildMessage {
  std::uint32_t tag;
  std::uint32_t seq;
  std::size_t bytes;
};

constexpr int wild_tags = 3;
constexpr std::size_t wild_count = 40;  // per ordered pair and phase
constexpr std::size_t wild_max = 200 * KiB;

std::vector<WildMessage> wild_messages(std::uint64_t seed, int phase, int sender, int receiver) {
  std::mt19937_64 rng(message_key(seed, sender, receiver, 0x3110 + static_cast<unsigned>(phase)));
  std::vector<WildMessage> out;
  std::uint32_t seq[wild_tags] = {};
  for (std::size_t i = 0; i < wild_count; ++i) {
    const auto tag = static_cast<std::uint32_t>(rng() % wild_tags);
    std::size_t bytes = log_uniform(rng, sizeof(WildHeader), wild_max);
    if (i % 7 == 3) bytes = eager_limit + 1 + i;  // a steady share of rendezvous messages
    out.push_back({tag, seq[tag]++, bytes});
  }
  return out;
}

// One phase: every rank sends wild_count messages to every other rank; receives use the given
// source/tag kind. Half the receives are posted before the sends, half after.
enum class WildKind { any_any, any_source, any_tag };

std::size_t wildcard_phase(Job& job, const Pattern& pattern, int phase, WildKind kind) {
  const int me = job.rank();
  const int n = job.size();
  const auto seed = job.seed();
  const char* kind_name = kind == WildKind::any_any      ? "any_source+any_tag"
                          : kind == WildKind::any_source ? "any_source"
                                                         : "any_tag";
  // What we will receive, per sender.
  std::vector<std::vector<WildMessage>> incoming(static_cast<std::size_t>(n));
  std::size_t total = 0;
  for (int s = 0; s < n; ++s) {
    if (s == me) continue;
    incoming[static_cast<std::size_t>(s)] = wild_messages(seed, phase, s, me);
    total += wild_count;
  }
  // The receives, in post order: (source, tag) as posted.
  struct Posted {
    int source;
    Tag tag;
    Buffer buf;
    Request req;
  };
  std::vector<Posted> posted;
  if (kind == WildKind::any_any) {
    for (std::size_t i = 0; i < total; ++i)
      posted.push_back({anview::any_source, anview::any_tag, Buffer(wild_max), {}});
  } else if (kind == WildKind::any_source) {
    // Per tag as many receives as messages carry it, interleaved across tags.
    std::vector<std::size_t> per_tag(wild_tags, 0);
    for (const auto& msgs : incoming)
      for (const auto& m : msgs) ++per_tag[m.tag];
    for (std::size_t round = 0; posted.size() < total; ++round)
      for (int t = 0; t < wild_tags; ++t)
        if (round < per_tag[static_cast<std::size_t>(t)])
          posted.push_back(
              {anview::any_source, Tag{static_cast<std::uint64_t>(t)}, Buffer(wild_max), {}});
  } else {
    for (std::size_t i = 0; i < wild_count; ++i)
      for (int s = 0; s < n; ++s)
        if (s != me) posted.push_back({s, anview::any_tag, Buffer(wild_max), {}});
  }
  auto post = [&](Posted& p) {
    p.req = job.comm().irecv(p.buf.data.get(), p.buf.capacity, p.source, p.tag);
  };
  const std::size_t early = posted.size() / 2;
  for (std::size_t i = 0; i < early; ++i) post(posted[i]);
  job.barrier(n);

  // Send: each message is its header followed by pattern bytes.
  std::vector<std::vector<unsigned char>> payloads;
  std::vector<Request> sends;
  for (int k = 1; k < n; ++k) {
    const int dst = (me + k) % n;
    const auto msgs = wild_messages(seed, phase, me, dst);
    for (std::size_t i = 0; i < msgs.size(); ++i) {
      const auto& m = msgs[i];
      std::vector<unsigned char> p(m.bytes);
      const WildHeader h{static_cast<std::uint32_t>(me), m.tag, m.seq,
                         static_cast<std::uint32_t>(i)};
      std::memcpy(p.data(), &h, sizeof h);
      std::memcpy(p.data() + sizeof h, pattern.at(message_key(seed, me, dst, i)),
                  m.bytes - sizeof h);
      payloads.push_back(std::move(p));
    }
  }
  std::size_t payload = 0;
  for (int k = 1; k < n; ++k) {
    const int dst = (me + k) % n;
    for (const auto& m : wild_messages(seed, phase, me, dst)) {
      sends.push_back(
          job.comm().isend(payloads[payload].data(), payloads[payload].size(), dst, Tag{m.tag}));
      ++payload;
    }
  }
  job.progress_for(10ms);
  for (std::size_t i = early; i < posted.size(); ++i) post(posted[i]);

  // In post order, every (sender, tag) stream must show seq 0, 1, 2, ... and, where the
  // receive matches any tag, every sender's messages must come in send order (index).
  std::map<std::pair<int, std::uint32_t>, std::uint32_t> next_seq;
  std::map<int, std::uint32_t> next_index;
  for (std::size_t i = 0; i < posted.size(); ++i) {
    auto& p = posted[i];
    const std::string what = cat("phase ", phase, " (", kind_name, ") receive #", i);
    const Status st = wait_for(p.req, what);
    require(st.bytes >= sizeof(WildHeader), what, ": only ", st.bytes, " bytes");
    WildHeader h;
    std::memcpy(&h, p.buf.data.get(), sizeof h);
    require(h.sender < static_cast<std::uint32_t>(n) && static_cast<int>(h.sender) != me &&
                h.index < wild_count,
            what, ": garbled header (sender ", h.sender, ", index ", h.index, ")");
    const auto& m = incoming[h.sender][h.index];
    require(st.source == static_cast<int>(h.sender), what, ": status.source ", st.source,
            " but the message is from rank ", h.sender);
    require(anview::to_underlying(st.tag) == h.tag && h.tag == m.tag, what, ": status.tag ",
            anview::to_underlying(st.tag), ", header tag ", h.tag, ", sent with tag ", m.tag);
    require(st.bytes == m.bytes, what, ": status.bytes ", st.bytes, ", sent ", m.bytes);
    if (p.source != anview::any_source)
      require(st.source == p.source, what, ": matched rank ", st.source, ", posted for ", p.source);
    if (p.tag != anview::any_tag)
      require(st.tag == p.tag, what, ": matched tag ", anview::to_underlying(st.tag),
              ", posted for ", anview::to_underlying(p.tag));
    auto& want_seq = next_seq[{st.source, h.tag}];
    require(h.seq == want_seq, what, ": from rank ", st.source, " tag ", h.tag, " got seq ", h.seq,
            ", expected ", want_seq, " (messages overtook each other)");
    ++want_seq;
    if (p.tag == anview::any_tag) {
      auto& want_index = next_index[st.source];
      require(h.index == want_index, what, ": from rank ", st.source, " got message ", h.index,
              ", expected ", want_index, " (any_tag receives must see send order)");
      ++want_index;
    }
    const long long bad = pattern.mismatch(p.buf.data.get() + sizeof h, st.bytes - sizeof h,
                                           message_key(seed, st.source, me, h.index));
    require(bad < 0, what, ": content differs at byte ", bad + static_cast<long long>(sizeof h));
  }
  for (auto& s : sends) s.wait();
  job.barrier(n);  // nobody's any_tag receive of the next phase may see this phase's messages
  return posted.size();
}

std::string wildcards(Job& job) {
  const Pattern pattern(job.seed(), wild_max);
  const auto start = Clock::now();
  std::size_t received = 0;
  received += wildcard_phase(job, pattern, 0, WildKind::any_any);
  received += wildcard_phase(job, pattern, 1, WildKind::any_source);
  received += wildcard_phase(job, pattern, 2, WildKind::any_tag);

  // A receive with wildcards is told the real source and tag even for an empty message.
  const int n = job.size();
  const int me = job.rank();
  char dummy = 0;
  Request r = job.comm().irecv(&dummy, 0, anview::any_source, anview::any_tag);
  job.barrier(n);
  job.comm().send(nullptr, 0, (me + 1) % n, Tag{100 + static_cast<std::uint64_t>(me)});
  const Status st = r.wait();
  const int from = (me + n - 1) % n;
  require(
      st.source == from && st.tag == Tag{100 + static_cast<std::uint64_t>(from)} && st.bytes == 0,
      "empty wildcard receive: source ", st.source, " tag ", anview::to_underlying(st.tag),
      " bytes ", st.bytes, ", expected ", from, "/", 100 + from, "/0");
  const double secs = seconds_since(start);
  job.leave(n);
  return cat(received, " wildcard receives on rank 0 in 3 phases (any/any, any_source, any_tag), ",
             secs, " s");
}

// ------------------------------------------------------------------------------------------
// ordering
// ------------------------------------------------------------------------------------------

constexpr std::size_t ordering_count = 5000;

std::size_t ordering_size(std::uint64_t seed, int sender, std::size_t i) {
  std::mt19937_64 rng(message_key(seed, sender, 0, 0x0D0 + i));
  if (i % 500 == 0) return eager_limit;      // the largest eager message
  if (i % 500 == 1) return eager_limit + 1;  // the smallest rendezvous message
  if (rng() % 10 == 0) return eager_limit + 1 + rng() % (64 * KiB);    // rendezvous
  return log_uniform(rng, 1, eager_limit) - (rng() % 4 == 0 ? 1 : 0);  // eager, 0 included
}

// Every rank sends ordering_count messages with one tag to the next rank and receives as many
// from the previous one. All sends are posted at once (they share the read-only pattern);
// receives run in a sliding window, so part of the messages meet a posted receive and part
// arrive before it (eager payloads buffered, rendezvous announcements queued). Receive i must
// get message i.
std::string ordering(Job& job) {
  const int me = job.rank();
  const int n = job.size();
  const int next = (me + 1) % n;
  const int prev = (me + n - 1) % n;
  const Tag tag{42};
  const Pattern pattern(job.seed(), 128 * KiB + 1);
  constexpr std::size_t window = 64;

  struct Recv {
    std::size_t bytes;
    Buffer buf;
    Request req;
  };
  std::vector<Recv> recvs(ordering_count);
  std::size_t posted = 0;
  auto post_next = [&] {
    Recv& r = recvs[posted];
    r.bytes = ordering_size(job.seed(), prev, posted);
    r.buf = Buffer(r.bytes + 8);
    r.req = job.comm().irecv(r.buf.data.get(), r.buf.capacity, prev, tag);
    ++posted;
  };
  while (posted < window) post_next();
  job.barrier(n);
  const auto start = Clock::now();

  std::vector<Request> sends;
  sends.reserve(ordering_count);
  std::size_t rendezvous = 0;
  for (std::size_t i = 0; i < ordering_count; ++i) {
    const std::size_t bytes = ordering_size(job.seed(), me, i);
    rendezvous += bytes > eager_limit;
    sends.push_back(
        job.comm().isend(pattern.at(message_key(job.seed(), me, next, i)), bytes, next, tag));
  }
  for (std::size_t i = 0; i < ordering_count; ++i) {
    Recv& r = recvs[i];
    const std::string what = cat("message ", i, " from rank ", prev);
    const Status st = wait_for(r.req, what);
    require(st.bytes == r.bytes, what, ": ", st.bytes, " bytes, expected ", r.bytes,
            " (received out of send order?)");
    check_received(pattern, st, r.buf, prev, tag, r.bytes, message_key(job.seed(), prev, me, i),
                   what + " (out of send order?)");
    r.buf = Buffer();
    if (posted < ordering_count) post_next();
  }
  for (auto& s : sends) s.wait();
  const double secs = seconds_since(start);
  job.leave(n);
  return cat(ordering_count, " messages per rank in send order (", rendezvous,
             " rendezvous on rank 0), ", secs, " s");
}

// ------------------------------------------------------------------------------------------
// outstanding
// ------------------------------------------------------------------------------------------

constexpr std::size_t outstanding_count = 10000;

std::size_t outstanding_size(std::uint64_t seed, int sender, int receiver, std::size_t i) {
  if (i % 1000 == 999) return eager_limit + 1 + (i / 1000) * 4099;  // a few rendezvous
  return splitmix(message_key(seed, sender, receiver, i)) % 2049;   // 0 .. 2 KiB
}

// Every rank posts outstanding_count receives from every other rank, then (after a barrier)
// outstanding_count sends to every other rank, and only then waits for all of them.
std::string outstanding(Job& job) {
  const int me = job.rank();
  const int n = job.size();
  const auto seed = job.seed();
  const Pattern pattern(seed, 2 * MiB);
  const auto tag_of = [](std::size_t i) { return Tag{i % 5}; };

  struct Arena {  // one peer's receive buffers, back to back
    std::vector<std::size_t> offset;
    Buffer buf;
  };
  std::vector<Arena> arenas(static_cast<std::size_t>(n));
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    Arena& a = arenas[static_cast<std::size_t>(p)];
    std::size_t total = 0;
    for (std::size_t i = 0; i < outstanding_count; ++i) {
      a.offset.push_back(total);
      total += outstanding_size(seed, p, me, i);
    }
    a.offset.push_back(total);
    a.buf = Buffer(total);
  }
  const auto start = Clock::now();
  std::vector<Request> recvs;  // index i * n + p
  recvs.resize(outstanding_count * static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < outstanding_count; ++i) {
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      Arena& a = arenas[static_cast<std::size_t>(p)];
      recvs[i * static_cast<std::size_t>(n) + static_cast<std::size_t>(p)] = job.comm().irecv(
          a.buf.data.get() + a.offset[i], a.offset[i + 1] - a.offset[i], p, tag_of(i));
    }
  }
  // Nothing has been sent yet: not one receive may be complete.
  for (const auto& r : recvs)
    require(!r.valid() || !r.done(), "a receive completed before anything was sent");
  job.barrier(n);

  std::vector<Request> sends;
  sends.reserve(outstanding_count * static_cast<std::size_t>(n - 1));
  for (std::size_t i = 0; i < outstanding_count; ++i) {
    for (int k = 1; k < n; ++k) {
      const int dst = (me + k) % n;
      sends.push_back(job.comm().isend(pattern.at(message_key(seed, me, dst, i)),
                                       outstanding_size(seed, me, dst, i), dst, tag_of(i)));
    }
  }
  std::size_t sends_pending = 0;
  for (const auto& s : sends) sends_pending += !s.done();
  std::size_t recvs_pending = 0;
  for (const auto& r : recvs) recvs_pending += r.valid() && !r.done();

  for (std::size_t i = 0; i < outstanding_count; ++i) {
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      Request& r = recvs[i * static_cast<std::size_t>(n) + static_cast<std::size_t>(p)];
      const Arena& a = arenas[static_cast<std::size_t>(p)];
      const std::size_t bytes = a.offset[i + 1] - a.offset[i];
      const std::string what = cat("message ", i, " from rank ", p);
      const Status st = wait_for(r, what);
      require(st.source == p && st.tag == tag_of(i) && st.bytes == bytes, what, ": status ",
              st.source, "/", anview::to_underlying(st.tag), "/", st.bytes, ", expected ", p, "/",
              anview::to_underlying(tag_of(i)), "/", bytes);
      const long long bad =
          pattern.mismatch(a.buf.data.get() + a.offset[i], bytes, message_key(seed, p, me, i));
      require(bad < 0, what, ": content differs at byte ", bad);
    }
  }
  for (auto& s : sends) s.wait();
  const double secs = seconds_since(start);
  job.leave(n);
  return cat(outstanding_count, " sends and receives per ordered pair (", sends.size(), " + ",
             sends.size(), " on rank 0; ", sends_pending, " sends and ", recvs_pending,
             " receives still pending after the last post), ", secs, " s");
}

// ------------------------------------------------------------------------------------------
// timeout
// ------------------------------------------------------------------------------------------

void check_timeout_error(const std::optional<Error>& e, int rank, int peer, std::uint64_t tag,
                         double elapsed, const std::string& what) {
  require(e.has_value(), what, ": returned instead of timing out");
  require(e->kind() == ErrorKind::timeout, what, ": expected a timeout, got ", describe(*e));
  require(e->rank() == rank, what, ": error names rank ", e->rank(), ", expected ", rank);
  require(e->peer() == peer, what, ": error names peer ", e->peer(), ", expected ", peer);
  require(e->operation() == "recv", what, ": error names operation '", e->operation(), "'");
  require(e->context().tag && *e->context().tag == tag, what, ": error tag ",
          e->context().tag ? std::to_string(*e->context().tag) : "none", ", expected ", tag);
  const std::string text = e->what();
  for (const std::string& part : {cat("rank ", rank), std::string("recv"), std::to_string(tag)})
    require(text.find(part) != std::string::npos, what, ": what() does not name '", part,
            "': ", text);
  if (peer >= 0)
    require(text.find(cat("peer ", peer)) != std::string::npos, what,
            ": what() does not name the peer: ", text);
  require(elapsed >= 0.3 && elapsed <= 2.0, what, ": timed out after ", elapsed,
          " s, expected 0.3 .. 2 s");
}

std::string timeout(Job& job) {
  const int me = job.rank();
  const int n = job.size();
  const int next = (me + 1) % n;
  const int prev = (me + n - 1) % n;
  job.barrier(n);

  // A blocking receive from a rank that sends nothing.
  char buf[64];
  auto t0 = Clock::now();
  auto e = error_of([&] { job.comm().recv(buf, sizeof buf, next, Tag{777}, 300ms); });
  const double blocking = seconds_since(t0);
  check_timeout_error(e, me, next, 777, blocking, "recv(from next rank, tag 777, 300 ms)");

  // The same from any rank.
  t0 = Clock::now();
  e = error_of([&] { job.comm().recv(buf, sizeof buf, anview::any_source, Tag{778}, 300ms); });
  check_timeout_error(e, me, -1, 778, seconds_since(t0), "recv(any_source, tag 778, 300 ms)");

  // Request::wait with a timeout leaves the receive pending; it completes once a message comes.
  char late[64] = {};
  Request pending = job.comm().irecv(late, sizeof late, next, Tag{779});
  t0 = Clock::now();
  e = error_of([&] { pending.wait(300ms); });
  check_timeout_error(e, me, next, 779, seconds_since(t0), "irecv(tag 779).wait(300 ms)");
  require(!pending.done(), "the request is complete after its wait timed out");

  job.barrier(n);
  // Now the messages come: tag 779 completes the pending receive; tag 777 must reach a fresh
  // receive (the timed-out blocking one was cancelled and must not swallow it).
  const std::string text779 = cat("late 779 from ", me);
  const std::string text777 = cat("late 777 from ", me);
  // (isend: with ANVIEW_EAGER_BYTES=0 these are rendezvous sends, and blocking ones would wait
  // for each other around the ring.)
  Request late_sends[] = {job.comm().isend(text779.data(), text779.size(), prev, Tag{779}),
                          job.comm().isend(text777.data(), text777.size(), prev, Tag{777})};
  Status st = pending.wait();
  require(st.source == next && std::string(late, st.bytes) == cat("late 779 from ", next),
          "the pending receive got '", std::string(late, st.bytes), "' from rank ", st.source);
  st = job.comm().recv(buf, sizeof buf, next, Tag{777});
  require(std::string(buf, st.bytes) == cat("late 777 from ", next),
          "after the timeout, tag 777 delivered '", std::string(buf, st.bytes), "'");
  for (auto& r : late_sends) r.wait();

  // Normal traffic, eager and rendezvous, both ways around the ring.
  const Pattern pattern(job.seed(), 3 * MiB);
  const std::size_t sizes[] = {0, 1, 4097, eager_limit + 1, 3 * MiB};
  std::vector<Request> sends;
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    sends.push_back(job.comm().isend(pattern.at(message_key(job.seed(), me, next, i)), sizes[i],
                                     next, Tag{900 + i}));
    sends.push_back(job.comm().isend(pattern.at(message_key(job.seed(), me, prev, 100 + i)),
                                     sizes[i], prev, Tag{950 + i}));
  }
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    Buffer b(sizes[i]);
    st = job.comm().recv(b.data.get(), b.capacity, prev, Tag{900 + i});
    check_received(pattern, st, b, prev, Tag{900 + i}, sizes[i],
                   message_key(job.seed(), prev, me, i), cat("ring message ", i));
    st = job.comm().recv(b.data.get(), b.capacity, next, Tag{950 + i});
    check_received(pattern, st, b, next, Tag{950 + i}, sizes[i],
                   message_key(job.seed(), next, me, 100 + i), cat("reverse ring message ", i));
  }
  for (auto& s : sends) s.wait();
  job.leave(n);
  return cat("three 300 ms timeouts with the right fields (blocking recv took ", blocking,
             " s), the pending request completed later, traffic works after");
}

// ------------------------------------------------------------------------------------------
// kill
// ------------------------------------------------------------------------------------------

void check_lost(const std::optional<Error>& e, int rank, int victim, const std::string& operation,
                const std::string& what) {
  require(e.has_value(), what, ": succeeded although rank ", victim, " is dead");
  require(e->kind() == ErrorKind::peer_lost, what, ": expected peer_lost, got ", describe(*e));
  require(e->peer() == victim, what, ": error names peer ", e->peer(), ", expected ", victim, ": ",
          e->what());
  require(e->rank() == rank, what, ": error names rank ", e->rank(), ": ", e->what());
  require(e->operation() == operation, what, ": error names operation '", e->operation(),
          "', expected '", operation, "'");
  require(std::string(e->what()).find(cat("peer ", victim)) != std::string::npos, what,
          ": what() does not name peer ", victim, ": ", e->what());
}

std::string kill_rank(Job& job) {
  const int me = job.rank();
  const int n = job.size();
  const int victim = n - 1;
  require(n >= 2, "kill needs at least 2 ranks");
  // Receives pending when the victim dies: a small and a rendezvous-sized one from it, and
  // one from any rank.
  std::vector<char> small(1024), big(2 * MiB), any(1024);
  Request from_victim, big_from_victim, from_any;
  if (me != victim) {
    from_victim = job.comm().irecv(small.data(), small.size(), victim, Tag{10});
    big_from_victim = job.comm().irecv(big.data(), big.size(), victim, Tag{12});
    from_any = job.comm().irecv(any.data(), any.size(), anview::any_source, Tag{11});
  }
  // The victim's last words: an eager message each survivor receives only after the death
  // (it arrived complete, so it must still be delivered), and a rendezvous announcement whose
  // payload can never come (its receive must fail).
  const std::string last_words = cat("last words of rank ", victim);
  const std::vector<char> unsent(MiB + 1, 'u');
  // --preload BYTES: before that, the victim floods every survivor with BYTES of eager messages
  // nobody receives until the end, so a budget (ANVIEW_UNEXPECTED_BYTES) below BYTES makes the
  // survivors stop reading from it before it dies.
  constexpr std::size_t preload_message = 16 * KiB;
  const std::size_t preload_count = job.options().preload_bytes / preload_message;
  if (me == victim) {
    std::vector<Request> eager, rendezvous;
    for (int r = 0; r < victim; ++r)
      for (std::size_t i = 0; i < preload_count; ++i)
        eager.push_back(job.comm().isend(unsent.data(), preload_message, r, Tag{30}));
    for (int r = 0; r < victim; ++r) {
      eager.push_back(job.comm().isend(last_words.data(), last_words.size(), r, Tag{16}));
      rendezvous.push_back(job.comm().isend(unsent.data(), unsent.size(), r, Tag{17}));
    }
    for (auto& r : eager) r.wait();
  }
  job.barrier(n);
  if (me == victim) {
    ::kill(::getpid(), SIGKILL);
    ::pause();
  }
  const auto t0 = Clock::now();
  auto e = error_of([&] { from_victim.wait(); });
  const double detected = seconds_since(t0);
  check_lost(e, me, victim, "recv", "pending receive from the killed rank");
  require(e->context().tag == 10u, "pending receive: error tag is not 10: ", e->what());
  require(detected < 3.0, "the pending receive failed only after ", detected, " s");
  check_lost(error_of([&] { big_from_victim.wait(); }), me, victim, "recv",
             "pending rendezvous-sized receive from the killed rank");
  if (n == 2) {
    // Every other rank is gone: the any_source receive cannot be satisfied either.
    check_lost(error_of([&] { from_any.wait(); }), me, victim, "recv",
               "pending any_source receive with every other rank dead");
  } else {
    require(!from_any.done(), "the any_source receive completed although live ranks remain: ",
            from_any.error() ? from_any.error()->what() : "no error");
  }

  // New operations with the dead rank fail at once with the same root cause.
  const std::vector<char> payload(3 * MiB, 'x');
  auto t1 = Clock::now();
  check_lost(error_of([&] { job.comm().send(payload.data(), 100, victim, Tag{13}); }), me, victim,
             "send", "eager send to the killed rank");
  check_lost(error_of([&] { job.comm().send(payload.data(), payload.size(), victim, Tag{14}); }),
             me, victim, "send", "rendezvous send to the killed rank");
  check_lost(error_of([&] { job.comm().recv(small.data(), small.size(), victim, Tag{15}); }), me,
             victim, "recv", "new receive from the killed rank");
  const double fast = seconds_since(t1);
  require(fast < 1.0, "operations with the killed rank took ", fast, " s to fail");
  std::vector<char> words(1024);
  Request words_req = job.comm().irecv(words.data(), words.size(), victim, Tag{16});
  // Over UCX a completed send only means its buffer may be reused (UCX's semantics), not that
  // the bytes left the sender: a rank killed right after may take its last words with it (seen
  // about once in seven runs of mp.kill.UcxTcpFourRanks). Anview's own transports deliver them.
  const bool words_may_die = job.comm().transport_name(victim) == "ucx";
  if (preload_count == 0 && !words_may_die) {
    const Status said =
        wait_for(words_req, "the killed rank's last eager message, received after its death");
    require(said.source == victim && std::string(words.data(), said.bytes) == last_words,
            "the killed rank's last words arrived as '", std::string(words.data(), said.bytes),
            "'");
  } else if (auto lost = error_of([&] { words_req.wait(); })) {
    // Behind the unread preload, or over UCX (above), the last words may be lost with the link.
    check_lost(lost, me, victim, "recv",
               preload_count > 0 ? "receive of the last words behind the preload"
                                 : "receive of the last words over ucx");
  } else if (preload_count == 0) {  // over UCX, and they came: whole
    require(std::string(words.data(), words_req.status().bytes) == last_words,
            "the killed rank's last words arrived as '",
            std::string(words.data(), words_req.status().bytes), "'");
  }
  std::vector<char> never(MiB + 1);
  check_lost(error_of([&] { job.comm().recv(never.data(), never.size(), victim, Tag{17}); }), me,
             victim, "recv", "receive of a rendezvous message the killed rank announced");
  // The preloaded messages: how many of them can still be received is not specified (those
  // still in the socket when the link failed may be gone), but each one that comes is whole.
  std::size_t preloaded = 0;
  for (; preloaded < preload_count; ++preloaded) {
    Buffer b(preload_message);
    Status st;
    auto lost = error_of([&] { st = job.comm().recv(b.data.get(), b.capacity, victim, Tag{30}); });
    if (lost) {
      check_lost(lost, me, victim, "recv", "receive of a preloaded message");
      break;
    }
    require(st.bytes == preload_message &&
                std::memcmp(b.data.get(), unsent.data(), preload_message) == 0,
            "preloaded message ", preloaded, " arrived damaged");
  }

  // The survivors still talk to each other (a ring among ranks 0 .. n-2). The barrier keeps
  // a fast survivor's message from satisfying the any_source receive of a slower one before
  // that one has checked it is still pending.
  const int survivors = n - 1;
  job.barrier(survivors);
  if (survivors >= 2) {
    const int next = (me + 1) % survivors;
    const int prev = (me + survivors - 1) % survivors;
    const Pattern pattern(job.seed(), 3 * MiB);
    const std::size_t sizes[] = {1, eager_limit + 1, 3 * MiB};
    const std::string hello = cat("survivor ", me);
    std::vector<Request> sends;
    sends.push_back(job.comm().isend(hello.data(), hello.size(), next, Tag{11}));
    for (std::size_t i = 0; i < std::size(sizes); ++i)
      sends.push_back(job.comm().isend(pattern.at(message_key(job.seed(), me, next, i)), sizes[i],
                                       next, Tag{20 + i}));
    const Status st = from_any.wait();
    require(st.source == prev && std::string(any.data(), st.bytes) == cat("survivor ", prev),
            "the any_source receive got '", std::string(any.data(), st.bytes), "' from rank ",
            st.source, ", expected rank ", prev);
    for (std::size_t i = 0; i < std::size(sizes); ++i) {
      Buffer b(sizes[i]);
      const Status s = job.comm().recv(b.data.get(), b.capacity, prev, Tag{20 + i});
      check_received(pattern, s, b, prev, Tag{20 + i}, sizes[i],
                     message_key(job.seed(), prev, me, i), cat("survivor message ", i));
    }
    for (auto& s : sends) s.wait();
  }
  job.leave(survivors);
  return cat("peer_lost for rank ", victim, " after ", detected, " s; later operations failed in ",
             fast, " s",
             preload_count
                 ? cat("; ", preloaded, " of ", preload_count, " preloaded messages received")
                 : "",
             survivors >= 2 ? cat("; ", survivors, " survivors exchanged messages") : "");
}

// ------------------------------------------------------------------------------------------
// stop
// ------------------------------------------------------------------------------------------

// Whether process `pid` is stopped (state T in /proc/PID/stat).
bool is_stopped(long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] == 'T';
}

// Rank N-1 stops itself with SIGSTOP after a barrier. A hung peer is not a lost one: every
// survivor's receive from it must time out (kind timeout, naming it) within twice the
// timeout, and stay pending. Rank 0 then sends SIGCONT, and the pending receives complete with
// what the continued rank sends: a timeout must not have broken anything.
std::string stop(Job& job) {
  const int me = job.rank();
  const int n = job.size();
  const int victim = n - 1;
  const std::string hello = cat("rank ", victim, " is back");
  if (me == victim) job.store().set("check/stop/pid", std::to_string(::getpid()));
  char buf[64] = {};
  Request from_victim;
  if (me != victim) from_victim = job.comm().irecv(buf, sizeof buf, victim, Tag{40});
  job.barrier(n);
  if (me == victim) {
    ::raise(SIGSTOP);
    // Continued: answer everybody.
    std::vector<Request> sends;
    for (int r = 0; r < victim; ++r)
      sends.push_back(job.comm().isend(hello.data(), hello.size(), r, Tag{40}));
    for (int r = 0; r < victim; ++r) {
      char in[64];
      const Status st = job.comm().recv(in, sizeof in, r, Tag{41});
      require(std::string(in, st.bytes) == cat("hello from ", r), "rank ", r, " sent '",
              std::string(in, st.bytes), "'");
    }
    for (auto& r : sends) r.wait();
    job.leave(n);
    return "";
  }
  // Survivors.
  const std::string mine = cat("hello from ", me);
  Request to_victim = job.comm().isend(mine.data(), mine.size(), victim, Tag{41});
  const auto limit = 500ms;
  const auto t0 = Clock::now();
  auto e = error_of([&] { from_victim.wait(limit); });
  const double waited = seconds_since(t0);
  require(e.has_value(), "the receive from the stopped rank completed");
  require(e->kind() == ErrorKind::timeout,
          "receive from the stopped rank: expected a timeout, got ", describe(*e));
  require(e->peer() == victim && e->operation() == "recv" && e->context().tag == 40u,
          "the timeout does not name peer ", victim, ", recv, tag 40: ", e->what());
  require(waited >= 0.5 && waited < 1.0, "the timeout came after ", waited,
          " s, expected 0.5 .. 1 s (twice the timeout)");
  require(!from_victim.done(), "the receive is complete after its wait timed out");
  job.barrier(victim, "survivors");  // every survivor has seen its timeout
  if (me == 0) {
    const long pid = std::stol(job.store().get_string("check/stop/pid"));
    const auto deadline = Clock::now() + 10s;
    while (!is_stopped(pid)) {
      require(Clock::now() < deadline, "rank ", victim, " (pid ", pid, ") never stopped");
      std::this_thread::sleep_for(1ms);
    }
    ::kill(static_cast<pid_t>(pid), SIGCONT);
  }
  const Status st = wait_for(from_victim, "the pending receive after SIGCONT");
  require(st.source == victim && std::string(buf, st.bytes) == hello,
          "after SIGCONT the pending receive got '", std::string(buf, st.bytes), "'");
  wait_for(to_victim, "the send to the stopped rank");
  job.leave(n);
  return cat("rank ", victim, " stopped: receives from it timed out after ", waited,
             " s (timeout 0.5 s), stayed pending and completed after SIGCONT");
}

// ------------------------------------------------------------------------------------------
// Raw TCP: garbage and version
// ------------------------------------------------------------------------------------------

namespace hs = anview::transport::tcp;
namespace sp = anview::bootstrap::store_protocol;
namespace auth = anview::base::auth;

// The handshake, encoded by hand from the documented layout (little-endian, 88 bytes).
static_assert(offsetof(hs::Handshake, magic) == 0 && offsetof(hs::Handshake, version) == 4 &&
              offsetof(hs::Handshake, kind) == 6 && offsetof(hs::Handshake, job_id) == 8 &&
              offsetof(hs::Handshake, rank) == 16 && offsetof(hs::Handshake, world_size) == 20 &&
              offsetof(hs::Handshake, stream) == 24 &&
              offsetof(hs::Handshake, stream_count) == 26 &&
              offsetof(hs::Handshake, reason) == 28 && offsetof(hs::Handshake, auth) == 32 &&
              offsetof(hs::Handshake, nonce) == 40 && offsetof(hs::Handshake, mac) == 56 &&
              sizeof(hs::Handshake) == 88);
static_assert(hs::handshake_magic == 0x57564E41 && hs::protocol_version == 3);
static_assert(sp::magic == 0x54535641 && sp::version == 2 && sp::request_header_bytes == 16 &&
              sp::reply_header_bytes == 12);

using Bytes = std::vector<std::uint8_t>;

// The job's secret, which anview-run gives every job (empty when there is none).
std::string job_secret() {
  const char* v = std::getenv("ANVIEW_SECRET");
  return v ? v : "";
}

struct Hello {
  std::uint32_t magic = hs::handshake_magic;
  std::uint16_t version = hs::protocol_version;
  std::uint16_t kind = 1;  // hello
  std::uint64_t job_id = 0;
  std::uint32_t rank = 0;
  std::uint32_t world_size = 0;
  std::uint16_t stream = 0;
  std::uint16_t stream_count = 0;
  std::uint32_t reason = 0;
  // Version 3: authentication.
  std::uint32_t auth = job_secret().empty() ? 0 : 1;
  auth::Nonce nonce = auth::fresh_nonce();
  auth::Mac mac{};

  static constexpr std::size_t bytes = 88;

  Bytes encode() const {
    Bytes b(bytes);
    sp::put_u32(&b[0], magic);
    sp::put_u16(&b[4], version);
    sp::put_u16(&b[6], kind);
    sp::put_u64(&b[8], job_id);
    sp::put_u32(&b[16], rank);
    sp::put_u32(&b[20], world_size);
    sp::put_u16(&b[24], stream);
    sp::put_u16(&b[26], stream_count);
    sp::put_u32(&b[28], reason);
    sp::put_u32(&b[32], auth);
    std::memcpy(&b[40], nonce.data(), nonce.size());
    std::memcpy(&b[56], mac.data(), mac.size());
    return b;
  }
  static Hello decode(const Bytes& b) {
    Hello h;
    h.magic = sp::get_u32(&b[0]);
    h.version = sp::get_u16(&b[4]);
    h.kind = sp::get_u16(&b[6]);
    h.job_id = sp::get_u64(&b[8]);
    h.rank = sp::get_u32(&b[16]);
    h.world_size = sp::get_u32(&b[20]);
    h.stream = sp::get_u16(&b[24]);
    h.stream_count = sp::get_u16(&b[26]);
    h.reason = sp::get_u32(&b[28]);
    if (b.size() >= bytes) {
      h.auth = sp::get_u32(&b[32]);
      std::memcpy(h.nonce.data(), &b[40], h.nonce.size());
      std::memcpy(h.mac.data(), &b[56], h.mac.size());
    }
    return h;
  }
  // The transport's struct of the same bytes, for its proof functions.
  hs::Handshake handshake() const {
    const Bytes b = encode();
    hs::Handshake h;
    static_assert(sizeof h == bytes);
    std::memcpy(static_cast<void*>(&h), b.data(), bytes);
    return h;
  }
};

// A store request header, by hand from docs/store-protocol.md.
Bytes store_header(std::uint32_t magic, std::uint16_t version, std::uint8_t op, std::uint8_t flags,
                   std::uint32_t key_count, std::uint32_t body_bytes) {
  Bytes b(16);
  sp::put_u32(&b[0], magic);
  sp::put_u16(&b[4], version);
  b[6] = op;
  b[7] = flags;
  sp::put_u32(&b[8], key_count);
  sp::put_u32(&b[12], body_bytes);
  return b;
}

// A listening port to attack: the store (rank -1) or a rank's data listener.
struct Target {
  std::string address;
  int rank;
  std::string name() const {
    return rank < 0 ? "store " + address : cat("rank ", rank, " data port ", address);
  }
};

class RawConn {
 public:
  RawConn(const std::string& host_port, const std::string& name) : name_(name) {
    const auto colon = host_port.rfind(':');
    require(colon != std::string::npos, "bad address '", host_port, "'");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(std::stoi(host_port.substr(colon + 1))));
    require(::inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &addr.sin_addr) == 1,
            "bad address '", host_port, "'");
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    require(fd_ >= 0, "socket(): ", std::strerror(errno));
    timeval tv{.tv_sec = 3, .tv_usec = 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    require(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0, "connect to ",
            name_, ": ", std::strerror(errno));
    const int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;
  ~RawConn() { close(); }

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Closes with a TCP reset instead of a FIN.
  void reset() {
    const linger hard{.l_onoff = 1, .l_linger = 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
    close();
  }

  // Sends everything it can; the other side may already have dropped us (then false).
  bool send(const Bytes& bytes) {
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += static_cast<std::size_t>(n);
    }
    return true;
  }

  enum class End { eof, reset, open };
  struct Outcome {
    Bytes reply;
    End end = End::open;
  };

  // Reads exactly `n` bytes (fewer when the peer closes first or `limit` passes), driving
  // `pump` meanwhile.
  Bytes read_exact(std::size_t n, std::chrono::milliseconds limit,
                   const std::function<void()>& pump) {
    Bytes out;
    const auto end = Clock::now() + limit;
    while (out.size() < n && Clock::now() < end) {
      pump();
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 2) <= 0) continue;
      std::uint8_t chunk[4096];
      const ssize_t got = ::recv(fd_, chunk, std::min(sizeof chunk, n - out.size()), MSG_DONTWAIT);
      if (got > 0) {
        out.insert(out.end(), chunk, chunk + got);
      } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
        break;
      }
    }
    return out;
  }

  // Whether the other side closed (or reset) the connection; does not wait. What it sent
  // before is read and thrown away.
  bool closed_by_peer() {
    for (;;) {
      std::uint8_t chunk[4096];
      const ssize_t n = ::recv(fd_, chunk, sizeof chunk, MSG_DONTWAIT);
      if (n > 0) continue;
      if (n == 0) return true;
      if (errno == EINTR) continue;
      return errno != EAGAIN && errno != EWOULDBLOCK;  // ECONNRESET, or worse
    }
  }

  // Reads until the peer closes (or resets) or `limit` passes, driving `pump` meanwhile (the
  // attacked port may be our own, served only while we drive progress).
  Outcome read_until_close(std::chrono::milliseconds limit, const std::function<void()>& pump) {
    Outcome out;
    const auto end = Clock::now() + limit;
    while (Clock::now() < end) {
      pump();
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 2) <= 0) continue;
      std::uint8_t chunk[4096];
      const ssize_t n = ::recv(fd_, chunk, sizeof chunk, MSG_DONTWAIT);
      if (n > 0) {
        out.reply.insert(out.reply.end(), chunk, chunk + n);
      } else if (n == 0) {
        out.end = End::eof;
        return out;
      } else if (errno == ECONNRESET) {
        out.end = End::reset;
        return out;
      } else if (errno != EAGAIN && errno != EINTR) {
        throw Failure(cat(name_, ": recv(): ", std::strerror(errno)));
      }
    }
    return out;
  }

  const std::string& name() const { return name_; }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  std::string name_;
};

constexpr auto drop_limit = 5000ms;

// The attacked side must close without answering (foreign bytes get no reply).
void expect_dropped(const RawConn::Outcome& o, const std::string& what) {
  require(o.end != RawConn::End::open, what, ": the connection was not closed within ",
          drop_limit.count(), " ms");
  require(o.reply.empty(), what, ": expected no reply, got ", o.reply.size(), " bytes");
}

// The attacked data port must answer with a reject for `reason`, then close.
void expect_reject(const RawConn::Outcome& o, hs::RejectReason reason, const std::string& what,
                   std::optional<std::uint64_t> job_id = {}, int rank = -1, int world_size = -1) {
  require(o.reply.size() == Hello::bytes, what, ": expected an 88-byte reject, got ",
          o.reply.size(), " bytes (", o.end == RawConn::End::open ? "still open" : "then closed",
          ")");
  const Hello h = Hello::decode(o.reply);
  require(h.magic == hs::handshake_magic, what, ": reply magic ", h.magic);
  require(h.kind == static_cast<std::uint16_t>(hs::HandshakeKind::reject), what, ": reply kind ",
          h.kind, ", expected 3 (reject)");
  require(h.reason == static_cast<std::uint32_t>(reason), what, ": reject reason ", h.reason, " (",
          hs::to_string(static_cast<hs::RejectReason>(h.reason)), "), expected ",
          static_cast<std::uint32_t>(reason), " (", hs::to_string(reason), ")");
  require(h.version == hs::protocol_version, what, ": reply version field ", h.version,
          ", expected ", hs::protocol_version);
  if (job_id)
    require(h.job_id == *job_id, what, ": reply job id ", h.job_id, ", expected ", *job_id);
  if (rank >= 0) require(h.rank == static_cast<std::uint32_t>(rank), what, ": reply rank ", h.rank);
  if (world_size >= 0)
    require(h.world_size == static_cast<std::uint32_t>(world_size), what, ": reply world size ",
            h.world_size);
  require(o.end == RawConn::End::eof, what, ": after the reject the connection was ",
          o.end == RawConn::End::open ? "left open" : "reset instead of closed");
}

// The store must answer with an error reply of `status` (text body), then close.
void expect_store_error(const RawConn::Outcome& o, sp::Status status, const std::string& what) {
  require(o.reply.size() >= 12, what, ": expected a store error reply, got ", o.reply.size(),
          " bytes (", o.end == RawConn::End::open ? "still open" : "then closed", ")");
  const std::uint32_t magic = sp::get_u32(&o.reply[0]);
  const std::uint16_t version = sp::get_u16(&o.reply[4]);
  const std::uint8_t got = o.reply[6];
  const std::uint32_t body = sp::get_u32(&o.reply[8]);
  require(magic == sp::magic, what, ": reply magic ", magic);
  require(version == sp::version, what, ": reply version ", version, ", expected ", sp::version);
  require(got == static_cast<std::uint8_t>(status), what, ": reply status ", int{got},
          ", expected ", static_cast<int>(status));
  require(body == o.reply.size() - 12 && body > 0 && body <= sp::max_error_text_bytes, what,
          ": error text of ", body, " bytes with ", o.reply.size() - 12, " received");
  require(o.end == RawConn::End::eof, what, ": after the error reply the connection was ",
          o.end == RawConn::End::open ? "left open" : "reset instead of closed");
}

// Every listening port of the job: the store, then each rank's published data addresses.
std::vector<Target> all_targets(Job& job) {
  std::vector<Target> targets{{Job::root_address(), -1}};
  for (int r = 0; r < job.size(); ++r) {
    const auto record = nlohmann::json::parse(job.store().get_string(cat("anview/peer/", r)));
    require(record.at("rank").get<int>() == r, "peer record of rank ", r, " names rank ",
            record.at("rank"));
    const auto addresses = record.at("tcp").get<std::vector<std::string>>();
    require(!addresses.empty(), "rank ", r, " published no TCP address");
    for (const auto& a : addresses) targets.push_back({a, r});
  }
  return targets;
}

std::uint64_t job_id(Job& job) {
  return std::stoull(job.store().get_string("anview/job_id"));
}

int stream_count() {
  const char* v = std::getenv("ANVIEW_TCP_STREAMS");
  return v && *v ? std::atoi(v) : 2;
}

// One round of traffic that must work after every attack: every rank sends three
// content-checked messages (empty, eager, rendezvous) to every rank, itself included, and
// makes a store round-trip.
void traffic_round(Job& job, const Pattern& pattern, int round) {
  const int me = job.rank();
  const int n = job.size();
  const std::size_t sizes[] = {0, 17, eager_limit + 1 + static_cast<std::size_t>(me)};
  const auto base = static_cast<std::uint64_t>(round) * 10;
  std::vector<Request> sends;
  for (int k = 0; k < n; ++k) {
    const int dst = (me + k) % n;
    for (std::size_t i = 0; i < 3; ++i) {
      const std::size_t bytes = i == 2 ? eager_limit + 1 + static_cast<std::size_t>(me) : sizes[i];
      sends.push_back(job.comm().isend(pattern.at(message_key(job.seed(), me, dst, base + i)),
                                       bytes, dst, Tag{base + i}));
    }
  }
  for (int src = 0; src < n; ++src) {
    for (std::size_t i = 0; i < 3; ++i) {
      const std::size_t bytes = i == 2 ? eager_limit + 1 + static_cast<std::size_t>(src) : sizes[i];
      Buffer b(bytes);
      const std::string what = cat("round ", round, ": message ", i, " from rank ", src);
      Request req = job.comm().irecv(b.data.get(), b.capacity, src, Tag{base + i});
      const Status st = wait_for(req, what);
      check_received(pattern, st, b, src, Tag{base + i}, bytes,
                     message_key(job.seed(), src, me, base + i), what);
    }
  }
  for (auto& s : sends) s.wait();
  const std::string key = cat("check/round/", round, "/");
  job.store().set(key + std::to_string(me), cat("value ", round, " of ", me));
  const int other = (me + 1) % n;
  const std::string got = job.store().get_string(key + std::to_string(other));
  require(got == cat("value ", round, " of ", other), "round ", round, ": store returned '", got,
          "' for rank ", other);
}

// Rank 0 runs `attack` against every target while the others wait for its go-ahead (waiting
// drives their progress, so their listeners are served); then everybody checks the job.
void attack_round(Job& job, const Pattern& pattern, int& round, const std::string& name,
                  const std::function<void(const Target&, RawConn&, const std::string&)>& attack,
                  const std::vector<Target>& targets, std::string& log) {
  const Tag go{1'000'000};
  if (job.rank() == 0) {
    for (const auto& t : targets) {
      const std::string what = name + " -> " + t.name();
      RawConn conn(t.address, what);
      attack(t, conn, what);
    }
    for (int r = 1; r < job.size(); ++r) job.comm().send(&round, sizeof round, r, go);
    log += (log.empty() ? "" : ", ") + name;
  } else {
    int got = -1;
    job.comm().recv(&got, sizeof got, 0, go);
    require(got == round, "go-ahead for round ", got, ", expected ", round);
  }
  traffic_round(job, pattern, round++);
}

Bytes random_bytes(std::mt19937_64& rng, std::size_t size) {
  Bytes b(size);
  for (auto& x : b) x = static_cast<std::uint8_t>(rng());
  return b;
}

// Random bytes (the first one 0xFF: no magic of ours, no TLS record) are dropped unanswered.
void random_bytes_round(Job& job, const Pattern& pattern, int& round, std::mt19937_64& rng,
                        const std::function<void()>& pump, const std::vector<Target>& targets,
                        std::string& done) {
  attack_round(
      job, pattern, round, "random bytes",
      [&](const Target&, RawConn& c, const std::string& what) {
        Bytes b = random_bytes(rng, 300);
        b[0] = 0xFF;
        c.send(b);
        expect_dropped(c.read_until_close(drop_limit, pump), what);
      },
      targets, done);
}

std::string garbage(Job& job) {
  const Pattern pattern(job.seed(), eager_limit + 64);
  const int n = job.size();
  std::vector<Target> targets;
  std::vector<std::unique_ptr<RawConn>> idle;
  if (job.rank() == 0) {
    targets = all_targets(job);
    // Connections that say nothing at all stay open while the rest goes on.
    for (const auto& t : targets) idle.push_back(std::make_unique<RawConn>(t.address, t.name()));
  }
  job.barrier(n);
  Communicator& comm = job.comm();
  const std::function<void()> pump = [&comm] { comm.progress(); };
  std::mt19937_64 rng(job.seed());
  int round = 0;
  std::string done;

  random_bytes_round(job, pattern, round, rng, pump, targets, done);

  attack_round(
      job, pattern, round, "wrong magic",
      [&](const Target& t, RawConn& c, const std::string& what) {
        Bytes b;
        if (t.rank < 0) {
          b = store_header(0x12345678, sp::version, 1, 0, 1, 10);
          b.resize(26, 0);
        } else {
          Hello h;
          h.magic = 0x12345678;
          h.world_size = static_cast<std::uint32_t>(n);
          b = h.encode();
        }
        c.send(b);
        expect_dropped(c.read_until_close(drop_limit, pump), what);
      },
      targets, done);

  attack_round(
      job, pattern, round, "oversized header",
      [&](const Target& t, RawConn& c, const std::string& what) {
        if (t.rank < 0) {
          // A set announcing a 4 GiB body: refused from the header alone, nothing allocated.
          c.send(store_header(sp::magic, sp::version, 1, 0, 1, 0xFFFFFFFFu));
          expect_store_error(c.read_until_close(drop_limit, pump), sp::Status::bad_request, what);
          // And one byte over the largest valid set (one 4 KiB key and a 64 MiB value).
          RawConn c2(t.address, what + " (just over the limit)");
          c2.send(store_header(sp::magic, sp::version, 1, 0, 1, 4 + 4096 + (64u << 20) + 1));
          expect_store_error(c2.read_until_close(drop_limit, pump), sp::Status::bad_request,
                             what + " (just over the limit)");
          // A wait on more keys than allowed.
          RawConn c3(t.address, what + " (too many keys)");
          c3.send(store_header(sp::magic, sp::version, 5, 0, 5000, 5000 * 5));
          expect_store_error(c3.read_until_close(drop_limit, pump), sp::Status::bad_request,
                             what + " (too many keys)");
        } else {
          // A frame header announcing 4 GiB where the hello belongs: data frames are only read
          // after a handshake, so this is foreign bytes and must be dropped unanswered.
          anview::transport::FrameHeader f;
          f.type = 1;
          f.payload_bytes = 0xFFFFFFFFu;
          Bytes b(sizeof f);
          std::memcpy(b.data(), &f, sizeof f);
          c.send(b);
          expect_dropped(c.read_until_close(drop_limit, pump), what);
        }
      },
      targets, done);

  attack_round(
      job, pattern, round, "truncated handshake",
      [&](const Target& t, RawConn& c, const std::string&) {
        if (t.rank < 0) {
          Bytes b = store_header(sp::magic, sp::version, 2, 0, 1, 9);
          b.resize(10);  // header cut short
          c.send(b);
          c.close();
          RawConn c2(t.address, "truncated body");
          b = store_header(sp::magic, sp::version, 2, 0, 1, 9);
          b.insert(b.end(), {5, 0, 0, 0, 'a'});  // 5 of 9 body bytes
          c2.send(b);
        } else {
          Hello h;
          h.job_id = job_id(job);
          h.world_size = static_cast<std::uint32_t>(n);
          Bytes b = h.encode();
          b.resize(16);
          c.send(b);
        }
        // Closed by us; the peer must just forget the connection. The same once more, ended with
        // a reset instead of a FIN.
        RawConn c3(t.address, "truncated, then reset");
        c3.send(Bytes{0x41, 0x56, 0x53, 0x54, 1, 0, 2});
        c3.reset();
      },
      targets, done);

  attack_round(
      job, pattern, round, "connection flood",
      [&](const Target& t, RawConn&, const std::string&) {
        // 100 connections that say nothing stay open through the next traffic round (closed when
        // the next attack begins).
        for (int i = 0; i < 100; ++i)
          idle.push_back(std::make_unique<RawConn>(t.address, t.name()));
      },
      targets, done);

  idle.clear();
  attack_round(
      job, pattern, round, "version 99",
      [&](const Target& t, RawConn& c, const std::string& what) {
        if (t.rank < 0) {
          Bytes b = store_header(sp::magic, 99, 2, 0, 1, 5);
          b.insert(b.end(), {1, 0, 0, 0, 'k'});
          c.send(b);
          expect_store_error(c.read_until_close(drop_limit, pump), sp::Status::version_mismatch,
                             what);
        } else {
          Hello h;
          h.version = 99;
          h.job_id = job_id(job);
          h.world_size = static_cast<std::uint32_t>(n);
          h.stream_count = static_cast<std::uint16_t>(stream_count());
          // What every version shares (a version-2 hello is no longer); the port cannot know
          // the length of another version's hello.
          Bytes b = h.encode();
          b.resize(hs::handshake_prefix_bytes);
          c.send(b);
          expect_reject(c.read_until_close(drop_limit, pump), hs::RejectReason::version, what);
        }
      },
      targets, done);

  attack_round(
      job, pattern, round, "HTTP request",
      [&](const Target&, RawConn& c, const std::string& what) {
        const std::string http =
            "GET / HTTP/1.1\r\nHost: localhost\r\nUser-Agent: p2p_check\r\nConnection: "
            "close\r\n\r\n";
        c.send(Bytes(http.begin(), http.end()));
        expect_dropped(c.read_until_close(drop_limit, pump), what);
      },
      targets, done);

  attack_round(
      job, pattern, round, "handshake reply instead of hello",
      [&](const Target& t, RawConn& c, const std::string& what) {
        if (t.rank < 0) {
          // An unknown op on the store.
          c.send(store_header(sp::magic, sp::version, 9, 0, 1, 5));
          c.send(Bytes{1, 0, 0, 0, 'k'});
          expect_store_error(c.read_until_close(drop_limit, pump), sp::Status::bad_request, what);
        } else {
          Hello h;
          h.kind = static_cast<std::uint16_t>(hs::HandshakeKind::ack);
          h.job_id = job_id(job);
          h.world_size = static_cast<std::uint32_t>(n);
          c.send(h.encode());
          expect_dropped(c.read_until_close(drop_limit, pump), what);
        }
      },
      targets, done);

  idle.clear();
  job.leave(n);
  return cat(targets.size(), " ports (store + data) survived: ", done, "; ", round,
             " rounds of traffic and store round-trips after them");
}

std::string version(Job& job) {
  const Pattern pattern(job.seed(), eager_limit + 64);
  const int n = job.size();
  std::vector<Target> targets;
  if (job.rank() == 0) targets = all_targets(job);
  job.barrier(n);
  Communicator& comm = job.comm();
  const std::function<void()> pump = [&comm] { comm.progress(); };
  const std::uint64_t id = job.rank() == 0 ? job_id(job) : 0;
  const auto streams = static_cast<std::uint16_t>(stream_count());
  int round = 0;
  std::string done;
  // A hello that every check would accept from `from` to stream 0 (it is connected already).
  auto hello = [&](int from) {
    Hello h;
    h.job_id = id;
    h.rank = static_cast<std::uint32_t>(from);
    h.world_size = static_cast<std::uint32_t>(n);
    h.stream = 0;
    h.stream_count = streams;
    return h;
  };
  auto data_ports = [&] {
    std::vector<Target> out;
    for (const auto& t : targets)
      if (t.rank >= 0) out.push_back(t);
    return out;
  }();

  using hs::RejectReason;
  attack_round(
      job, pattern, round, "foreign job id",
      [&](const Target& t, RawConn& c, const std::string& what) {
        Hello h = hello(std::max(t.rank - 1, 0));
        h.job_id = id + 1;
        c.send(h.encode());
        expect_reject(c.read_until_close(drop_limit, pump), RejectReason::job, what, id, t.rank, n);
      },
      data_ports, done);

  attack_round(
      job, pattern, round, "wrong world size",
      [&](const Target& t, RawConn& c, const std::string& what) {
        Hello h = hello(std::max(t.rank - 1, 0));
        h.world_size = static_cast<std::uint32_t>(n + 1);
        c.send(h.encode());
        expect_reject(c.read_until_close(drop_limit, pump), RejectReason::world_size, what, id,
                      t.rank, n);
      },
      data_ports, done);

  attack_round(
      job, pattern, round, "rank that does not connect here",
      [&](const Target& t, RawConn& c, const std::string& what) {
        c.send(hello(t.rank).encode());  // only lower ranks connect to a rank
        expect_reject(c.read_until_close(drop_limit, pump), RejectReason::rank, what, id, t.rank,
                      n);
      },
      data_ports, done);

  if (n >= 2) {
    std::vector<Target> above_zero;
    for (const auto& t : data_ports)
      if (t.rank > 0) above_zero.push_back(t);
    attack_round(
        job, pattern, round, "wrong stream count",
        [&](const Target& t, RawConn& c, const std::string& what) {
          Hello h = hello(t.rank - 1);
          h.stream_count = static_cast<std::uint16_t>(streams + 1);
          c.send(h.encode());
          expect_reject(c.read_until_close(drop_limit, pump), RejectReason::streams, what, id,
                        t.rank, n);
        },
        above_zero, done);
    // Authentication (the job has the secret anview-run gave it): the data port answers a
    // hello with its challenge and its own proof, and nothing about its links.
    const auth::Secret secret(job_secret());
    require(!secret.empty(), "anview-run gave the job no ANVIEW_SECRET");
    auto challenge = [&](RawConn& c, const Hello& h, const std::string& what) {
      c.send(h.encode());
      const Bytes got = c.read_exact(Hello::bytes, drop_limit, pump);
      require(got.size() == Hello::bytes, what, ": expected an 88-byte challenge, got ", got.size(),
              " bytes");
      const Hello ack = Hello::decode(got);
      require(ack.kind == static_cast<std::uint16_t>(hs::HandshakeKind::ack) && ack.auth == 1, what,
              ": expected a challenge (ack with auth 1), got kind ", ack.kind, ", auth ", ack.auth);
      require(auth::same(ack.mac, hs::accept_proof(secret, h.handshake(), ack.handshake())), what,
              ": the challenge's proof of the job secret is wrong");
      return ack;
    };
    attack_round(
        job, pattern, round, "hello without the job secret",
        [&](const Target& t, RawConn& c, const std::string& what) {
          Hello h = hello(t.rank - 1);
          h.auth = 0;
          c.send(h.encode());
          expect_reject(c.read_until_close(drop_limit, pump), RejectReason::auth, what, id, t.rank,
                        n);
        },
        above_zero, done);
    attack_round(
        job, pattern, round, "wrong proof",
        [&](const Target& t, RawConn& c, const std::string& what) {
          const Hello h = hello(t.rank - 1);
          const Hello ack = challenge(c, h, what);
          Hello proof = ack;
          proof.kind = static_cast<std::uint16_t>(hs::HandshakeKind::proof);
          proof.mac = hs::connect_proof(auth::Secret("not the job's secret"), h.handshake(),
                                        ack.handshake());
          c.send(proof.encode());
          expect_dropped(c.read_until_close(drop_limit, pump), what);
        },
        above_zero, done);
    // A recorded hello and proof sent again: the port's new nonce makes the proof worthless.
    attack_round(
        job, pattern, round, "replayed proof",
        [&](const Target& t, RawConn& c, const std::string& what) {
          const Hello h = hello(t.rank - 1);
          Hello recorded;
          {
            RawConn first(t.address, what + " (recorded)");
            const Hello ack = challenge(first, h, what + " (recorded)");
            recorded = ack;
            recorded.kind = static_cast<std::uint16_t>(hs::HandshakeKind::proof);
            recorded.mac = hs::connect_proof(secret, h.handshake(), ack.handshake());
          }
          const Hello ack = challenge(c, h, what);
          require(!auth::same(ack.nonce, recorded.nonce), what,
                  ": the data port sent the same nonce twice");
          c.send(recorded.encode());
          expect_dropped(c.read_until_close(drop_limit, pump), what);
        },
        above_zero, done);
    // Impersonating the lower neighbour on a stream it already holds, even with the secret:
    // rejected after the proof, and the real link (checked by the traffic round after it)
    // must not be disturbed.
    attack_round(
        job, pattern, round, "duplicate stream",
        [&](const Target& t, RawConn& c, const std::string& what) {
          const Hello h = hello(t.rank - 1);
          const Hello ack = challenge(c, h, what);
          Hello proof = ack;
          proof.kind = static_cast<std::uint16_t>(hs::HandshakeKind::proof);
          proof.mac = hs::connect_proof(secret, h.handshake(), ack.handshake());
          c.send(proof.encode());
          expect_reject(c.read_until_close(drop_limit, pump), RejectReason::duplicate, what, id,
                        t.rank, n);
        },
        above_zero, done);
  }
  // The store answers a request of another version with version_mismatch.
  attack_round(
      job, pattern, round, "store version 2",
      [&](const Target&, RawConn& c, const std::string& what) {
        Bytes b = store_header(sp::magic, sp::version + 1, 4, 0, 1, 5);
        b.insert(b.end(), {1, 0, 0, 0, 'k'});
        c.send(b);
        expect_store_error(c.read_until_close(drop_limit, pump), sp::Status::version_mismatch,
                           what);
      },
      job.rank() == 0 ? std::vector<Target>{targets.front()} : std::vector<Target>{}, done);

  // The job's store serves nobody who has not proven the job secret.
  const std::vector<Target> store_only =
      job.rank() == 0 ? std::vector<Target>{targets.front()} : std::vector<Target>{};
  attack_round(
      job, pattern, round, "store request without the job secret",
      [&](const Target&, RawConn& c, const std::string& what) {
        Bytes b =
            store_header(sp::magic, sp::version, static_cast<std::uint8_t>(sp::Op::get), 0, 1, 5);
        b.insert(b.end(), {1, 0, 0, 0, 'k'});
        c.send(b);
        expect_store_error(c.read_until_close(drop_limit, pump), sp::Status::unauthenticated, what);
      },
      store_only, done);
  attack_round(
      job, pattern, round, "store: replayed proof",
      [&](const Target& t, RawConn& c, const std::string& what) {
        const auth::Secret secret(job_secret());
        const auth::Nonce nonce = auth::fresh_nonce();
        // hello: the client's nonce; the reply: the store's nonce and its proof.
        auto store_challenge = [&](RawConn& conn, const std::string& about) {
          Bytes b = store_header(sp::magic, sp::version, static_cast<std::uint8_t>(sp::Op::hello),
                                 0, 0, 16);
          b.insert(b.end(), nonce.begin(), nonce.end());
          conn.send(b);
          const Bytes got =
              conn.read_exact(sp::reply_header_bytes + sp::hello_reply_bytes, drop_limit, pump);
          require(got.size() == sp::reply_header_bytes + sp::hello_reply_bytes, about,
                  ": expected the store's challenge, got ", got.size(), " bytes");
          require(got[6] == static_cast<std::uint8_t>(sp::Status::ok), about,
                  ": hello answered with status ", int{got[6]});
          auth::Nonce server{};
          std::memcpy(server.data(), &got[sp::reply_header_bytes], server.size());
          auth::Mac mac{};
          std::memcpy(mac.data(), &got[sp::reply_header_bytes + server.size()], mac.size());
          require(auth::same(mac, sp::server_proof(secret, nonce, server)), about,
                  ": the store's proof of the job secret is wrong");
          return server;
        };
        auth::Mac recorded{};
        auth::Nonce first{};
        {
          RawConn conn(t.address, what + " (recorded)");
          first = store_challenge(conn, what + " (recorded)");
          recorded = sp::client_proof(secret, nonce, first);
        }
        const auth::Nonce second = store_challenge(c, what);
        require(!auth::same(first, second), what, ": the store sent the same nonce twice");
        Bytes b = store_header(sp::magic, sp::version, static_cast<std::uint8_t>(sp::Op::prove), 0,
                               0, 32);
        b.insert(b.end(), recorded.begin(), recorded.end());
        c.send(b);
        expect_store_error(c.read_until_close(drop_limit, pump), sp::Status::unauthenticated, what);
      },
      store_only, done);

  job.leave(n);
  return cat(data_ports.size(), " data ports rejected ", done, " with the right reasons; ", round,
             " rounds of traffic after them");
}

// ------------------------------------------------------------------------------------------
// main
// ------------------------------------------------------------------------------------------

// ------------------------------------------------------------------------------------------
// coll_kill: rank N-1 dies during a loop of allreduces
// ------------------------------------------------------------------------------------------

// Every rank runs allreduces of 1 MiB (ring) and 64 B (recursive doubling); after a barrier at
// iteration 20 the last rank SIGKILLs itself. Each survivor must fail within 3 s with
// peer_lost naming it -- also in the ring, where a survivor waits for a live neighbour.
std::string coll_kill(Job& job) {
  const int me = job.rank();
  const int n = job.size();
  const int victim = n - 1;
  require(n >= 3, "coll_kill needs at least 3 ranks");
  std::vector<float> big(256 * 1024, 1.0f);
  float small[16] = {};
  auto t0 = Clock::now();
  for (int i = 0;; ++i) {
    if (i == 20) {
      job.barrier(n, "coll_kill_armed");
      if (me == victim) {
        ::kill(::getpid(), SIGKILL);
        ::pause();
      }
      t0 = Clock::now();
    }
    try {
      job.comm().allreduce(big.data(), big.size(), anview::DataType::float32,
                           anview::ReduceOp::max);
      job.comm().allreduce(small, 16, anview::DataType::float32, anview::ReduceOp::sum);
    } catch (const Error& e) {
      const double after = seconds_since(t0);
      require(i >= 20, "allreduce failed before the victim died: ", describe(e));
      require(e.kind() == ErrorKind::peer_lost, "expected peer_lost, got ", describe(e));
      require(e.context().peer == victim, "the error names peer ", e.context().peer,
              ", not the killed rank ", victim, ": ", describe(e));
      require(std::string(e.what()).find("allreduce #") != std::string::npos,
              "the error does not name the collective call: ", describe(e));
      require(after < 3.0, "the survivors learnt of the death after ", after, " s");
      job.leave(n - 1);
      return cat("every survivor failed within ", after, " s naming rank ", victim);
    }
    require(i < 100000, "the allreduce loop went on after the victim died");
  }
}

// ------------------------------------------------------------------------------------------
// one_sided: put/get/flush between processes into both kinds of region; rma_kill: a target
// dies while a rank reads from it
// ------------------------------------------------------------------------------------------

std::vector<anview::RemoteKey> gather_keys(Job& job, const anview::MemoryRegion& region) {
  const auto mine = region.key().pack();
  std::vector<std::byte> all(mine.size() * static_cast<std::size_t>(job.size()));
  job.comm().allgather(mine.data(), all.data(), mine.size(), anview::DataType::uint8);
  std::vector<anview::RemoteKey> keys;
  for (int r = 0; r < job.size(); ++r)
    keys.push_back(anview::RemoteKey::unpack(std::span<const std::byte>(
        all.data() + mine.size() * static_cast<std::size_t>(r), mine.size())));
  return keys;
}

std::string one_sided(Job& job) {
  const int me = job.rank();
  const int n = job.size();
  const int next = (me + 1) % n;
  const int prev = (me + n - 1) % n;
  constexpr std::size_t slot = 3 * MiB;
  const std::vector<std::size_t> sizes = {1, 4096, 100000, 2 * MiB + 5};
  std::vector<char> user(slot * static_cast<std::size_t>(n), 0);
  anview::MemoryRegion registered = job.comm().register_memory(user.data(), user.size());
  anview::MemoryRegion allocated = job.comm().allocate_memory(slot * static_cast<std::size_t>(n));
  const auto user_keys = gather_keys(job, registered);
  const auto alloc_keys = gather_keys(job, allocated);
  auto byte = [](int writer, std::size_t m, std::size_t i) {
    return static_cast<char>((writer * 37 + m * 11 + i * 13) & 0x7f);
  };
  // Size m goes after the ones before it, one byte further (unaligned).
  auto place = [&](std::size_t m) {
    std::size_t at = m;
    for (std::size_t k = 0; k < m; ++k) at += sizes[k];
    return at;
  };
  for (const auto* keys : {&user_keys, &alloc_keys}) {
    const auto& target = (*keys)[static_cast<std::size_t>(next)];
    for (std::size_t m = 0; m < sizes.size(); ++m) {
      std::vector<char> out(sizes[m]);
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = byte(me, m, i);
      const std::uint64_t offset = slot * static_cast<std::size_t>(me) + place(m);
      job.comm().put(out.data(), out.size(), target, offset);  // completes by the flush
      job.comm().flush(next).wait();
      std::vector<char> back(sizes[m]);
      job.comm().get(back.data(), back.size(), target, offset).wait();
      require(back == out, "get after put of ", sizes[m], " bytes into rank ", next,
              " returned other bytes");
    }
  }
  // ANVIEW_UCX_RMA=native with the next rank on another host: every put and get above went
  // through UCX's RMA, not frames.
  const char* rma_mode = std::getenv("ANVIEW_UCX_RMA");
  if (rma_mode != nullptr && std::string(rma_mode) == "native" &&
      job.comm().describe_peer(next).find("cross-memory attach") == std::string::npos) {
    require(job.comm().describe_peer(next).find("one-sided: UCX RMA") != std::string::npos, "rank ",
            next, " is not reached through UCX's RMA: ", job.comm().describe_peer(next));
    double native = 0;
    const auto metrics = nlohmann::json::parse(anview::metrics_json());
    for (const auto& m : metrics["metrics"])
      if (m["name"] == "anview_rma_native_operations_total" &&
          m["labels"].value("peer", "") == std::to_string(next))
        native += m["value"].get<double>();
    require(native >= 4.0 * static_cast<double>(sizes.size()), "only ", native,
            " native puts and gets to rank ", next);
  }
  job.barrier(n);
  // What the previous rank put here, in both regions.
  for (const char* base :
       {static_cast<const char*>(user.data()), static_cast<const char*>(allocated.data())}) {
    for (std::size_t m = 0; m < sizes.size(); ++m)
      for (std::size_t i = 0; i < sizes[m]; ++i)
        require(base[slot * static_cast<std::size_t>(prev) + place(m) + i] == byte(prev, m, i),
                "byte ", i, " of what rank ", prev, " put (", sizes[m], " bytes) is wrong");
  }
  // Out of range: refused at the call, nothing written; stale: refused by the check.
  const char x = 'x';
  auto e = error_of([&] {
    job.comm().put(&x, 2, alloc_keys[static_cast<std::size_t>(next)],
                   slot * static_cast<std::size_t>(n) - 1);
  });
  require(e && e->kind() == ErrorKind::usage && e->operation() == "put",
          "a put past the region's end: ", e ? describe(*e) : "no error");
  job.barrier(n);
  registered.deregister();
  allocated.deregister();
  job.barrier(n);
  for (const auto* keys : {&user_keys, &alloc_keys}) {
    e = error_of([&] { job.comm().put(&x, 1, (*keys)[static_cast<std::size_t>(next)], 0).wait(); });
    require(e && e->kind() == ErrorKind::usage && e->peer() == next,
            "a put with a stale key: ", e ? describe(*e) : "no error");
  }
  job.leave(n);
  return cat("put, flush and get of ", sizes.size(),
             " sizes into registered and allocated regions of rank ", next,
             "; out-of-range and stale keys refused");
}

std::string rma_kill(Job& job) {
  const int me = job.rank();
  const int n = job.size();
  const int victim = n - 1;
  require(n >= 2, "rma_kill needs at least 2 ranks");
  anview::MemoryRegion region = job.comm().allocate_memory(4 * MiB);
  std::vector<char> user(4 * MiB, 'v');
  anview::MemoryRegion user_region = job.comm().register_memory(user.data(), user.size());
  const auto keys = gather_keys(job, region);
  const auto user_keys = gather_keys(job, user_region);
  job.barrier(n, "rma_kill_armed");
  if (me == victim) {
    ::kill(::getpid(), SIGKILL);
    ::pause();
  }
  // Read from the victim until its death shows: each path (mapped memory stays readable
  // after the owner's death, so the error may come from the link's failure) must then fail
  // with peer_lost naming it, within seconds.
  const auto t0 = Clock::now();
  std::vector<char> local(4 * MiB);
  std::optional<Error> lost;
  while (!lost && seconds_since(t0) < 10) {
    lost = error_of([&] {
      job.comm()
          .get(local.data(), local.size(), user_keys[static_cast<std::size_t>(victim)])
          .wait();
      job.comm().put(local.data(), 4096, keys[static_cast<std::size_t>(victim)]).wait();
      job.comm().flush(victim).wait();
    });
  }
  const double after = seconds_since(t0);
  require(lost.has_value(), "puts and gets to the killed rank still succeed after ", after, " s");
  require(lost->kind() == ErrorKind::peer_lost && lost->peer() == victim,
          "expected peer_lost naming rank ", victim, ", got ", describe(*lost));
  require(after < 3.0, "the failure showed only after ", after, " s");
  check_lost(error_of([&] {
               job.comm().get(local.data(), 8, keys[static_cast<std::size_t>(victim)]).wait();
             }),
             me, victim, "get", "a get from the killed rank, later");
  // A flush cannot say that operations with the killed rank are in place: the first reports
  // the first failure since the last flush (the get's), later ones fail like any later
  // operation with it (before, they succeeded).
  const auto first_flush = error_of([&] { job.comm().flush(victim).wait(); });
  require(first_flush && first_flush->kind() == ErrorKind::peer_lost,
          "a flush after operations with the killed rank failed did not fail with peer_lost");
  check_lost(error_of([&] { job.comm().flush(victim).wait(); }), me, victim, "flush",
             "a flush of the killed rank, later");
  job.leave(n - 1);
  return cat("puts and gets to the killed rank failed with peer_lost after ", after, " s");
}

// ------------------------------------------------------------------------------------------
// coll_direct: same-host allreduce that reads peers' memory, and where it must not be used
// ------------------------------------------------------------------------------------------

// Rank r's element i of the allreduce checks: small integers, so sums are exact in every type.
double direct_element(int rank, std::size_t i) {
  return static_cast<double>((rank + 1) * static_cast<int>(i % 7 + 1));
}

// Element i reduced over n ranks with `op` (sum, max or avg).
double direct_result(int n, std::size_t i, anview::ReduceOp op) {
  double want = 0;
  for (int r = 0; r < n; ++r) {
    const double v = direct_element(r, i);
    want = r == 0 ? v : op == anview::ReduceOp::max ? std::max(want, v) : want + v;
  }
  return op == anview::ReduceOp::avg ? want / n : want;
}

template <typename T>
T to_element(double v, anview::DataType type) {
  if constexpr (std::is_same_v<T, std::uint16_t>) {
    return type == anview::DataType::float16
               ? anview::collectives::float_to_half(static_cast<float>(v))
               : anview::collectives::float_to_bfloat16(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

template <typename T>
double from_element(T v, anview::DataType type) {
  if constexpr (std::is_same_v<T, std::uint16_t>) {
    return type == anview::DataType::float16 ? anview::collectives::half_to_float(v)
                                             : anview::collectives::bfloat16_to_float(v);
  } else {
    return static_cast<double>(v);
  }
}

// One allreduce of `count` elements, in place or not; checks the result everywhere (and that
// the send buffer is untouched). Returns the algorithm used.
template <typename T>
void checked_allreduce(Job& job, std::size_t count, anview::DataType type, anview::ReduceOp op,
                       bool in_place) {
  const int me = job.rank();
  const int n = job.size();
  std::vector<T> send(count), recv(count);
  for (std::size_t i = 0; i < count; ++i) send[i] = to_element<T>(direct_element(me, i), type);
  const std::vector<T> sent = send;
  if (in_place) {
    job.comm().allreduce(send.data(), count, type, op);
  } else {
    job.comm().allreduce(send.data(), recv.data(), count, type, op);
    require(send == sent, "allreduce changed its send buffer (", count, " elements)");
  }
  const std::vector<T>& got = in_place ? send : recv;
  for (std::size_t i = 0; i < count; ++i) {
    const double want = direct_result(n, i, op);
    const double value = from_element(got[i], type);
    require(std::abs(value - want) <= 1e-3 * std::abs(want), "allreduce of ", count, " ",
            anview::name_of(type), " ", anview::name_of(op), in_place ? " in place" : "",
            ": element ", i, " is ", value, ", not ", want);
  }
}

// Where a reduce_scatter's result goes: its own buffer, this rank's block of the send buffer,
// or the start of the send buffer (overlapping blocks that the peers read).
enum class Landing { apart, own_block, send_start };

// One reduce_scatter of `count` elements per rank; checks this rank's block (and that the
// send buffer is untouched where the result does not land).
template <typename T>
void checked_reduce_scatter(Job& job, std::size_t count, anview::DataType type, anview::ReduceOp op,
                            Landing landing) {
  const int me = job.rank();
  const int n = job.size();
  const std::size_t all = count * static_cast<std::size_t>(n);
  std::vector<T> send(all), apart(count);
  for (std::size_t i = 0; i < all; ++i) send[i] = to_element<T>(direct_element(me, i), type);
  const std::vector<T> sent = send;
  T* recv = landing == Landing::apart       ? apart.data()
            : landing == Landing::own_block ? send.data() + static_cast<std::size_t>(me) * count
                                            : send.data();
  job.comm().reduce_scatter(send.data(), recv, count, type, op);
  if (landing == Landing::apart)
    require(send == sent, "reduce_scatter changed its send buffer (", count, " elements)");
  const std::size_t first = static_cast<std::size_t>(me) * count;
  for (std::size_t i = 0; i < count; ++i) {
    const double want = direct_result(n, first + i, op);
    const double value = from_element(recv[i], type);
    require(std::abs(value - want) <= 1e-3 * std::abs(want), "reduce_scatter of ", count, " ",
            anview::name_of(type), " ", anview::name_of(op), " landing ", static_cast<int>(landing),
            ": element ", i, " is ", value, ", not ", want);
  }
}

std::string coll_direct(Job& job) {
  const int n = job.size();
  const Options& o = job.options();
  const char* transports = std::getenv("ANVIEW_TRANSPORTS");
  const char* forced_env = std::getenv("ANVIEW_ALGO");
  const std::string forced = forced_env ? forced_env : "";
  // Shared memory needs every rank on one host with shm; direct also cross-memory attach.
  const bool shared_possible =
      o.hosts <= 1 &&
      (transports == nullptr || std::string(transports).find("shm") != std::string::npos);
  const bool direct_possible = shared_possible && !o.deny_cma;
  // The same-host algorithms are candidates exactly where placement allows them; whether the
  // tuner picks one depends on the costs it measured (a 400 B allreduce in shared memory
  // always wins).
  std::string small_why, large_why;
  const std::string small = job.comm().collective_algorithm("allreduce", 400, &small_why);
  const std::string large = job.comm().collective_algorithm("allreduce", 1 << 20, &large_why);
  if (forced.empty()) {
    require((small == "shared") == shared_possible, "allreduce of 400 B uses ", small,
            shared_possible ? " where every rank is on one host with shm" : " across hosts");
    const bool direct_refused = large_why.find("direct cannot run") != std::string::npos;
    require(direct_refused == (large != "direct" && !direct_possible),
            "allreduce of 1 MiB: ", large, " (", large_why, ")",
            direct_possible ? " where every rank can read its peers' memory"
                            : " where some rank cannot read its peers' memory");
  }

  const std::size_t sizes[] = {static_cast<std::size_t>(n - 1), 1000, 65536 + 3, 300007};
  for (const std::size_t count : sizes) {
    for (const bool in_place : {false, true}) {
      checked_allreduce<float>(job, count, anview::DataType::float32, anview::ReduceOp::sum,
                               in_place);
      checked_allreduce<std::uint16_t>(job, count, anview::DataType::float16, anview::ReduceOp::avg,
                                       in_place);
      checked_allreduce<std::uint16_t>(job, count, anview::DataType::bfloat16,
                                       anview::ReduceOp::sum, in_place);
      checked_allreduce<std::int32_t>(job, count, anview::DataType::int32, anview::ReduceOp::max,
                                      in_place);
    }
  }
  // As for allreduce: direct is a candidate exactly where every rank can read its peers; the
  // pick is the measured costs' (under a loaded machine the ring has won it).
  std::string scatter_why;
  const std::string scatter =
      job.comm().collective_algorithm("reduce_scatter", (std::size_t{1} << 20) * n, &scatter_why);
  if (forced.empty()) {
    const bool direct_refused = scatter_why.find("direct cannot run") != std::string::npos;
    require(direct_refused == (scatter != "direct" && !direct_possible),
            "reduce_scatter of 1 MiB per rank: ", scatter, " (", scatter_why, ")",
            direct_possible ? " where every rank can read its peers' memory"
                            : " where some rank cannot read its peers' memory");
  }
  for (const std::size_t count : {std::size_t{1}, std::size_t{1000}, std::size_t{100003}}) {
    for (const Landing landing : {Landing::apart, Landing::own_block, Landing::send_start}) {
      checked_reduce_scatter<float>(job, count, anview::DataType::float32, anview::ReduceOp::sum,
                                    landing);
      checked_reduce_scatter<std::uint16_t>(job, count, anview::DataType::float16,
                                            anview::ReduceOp::avg, landing);
      checked_reduce_scatter<std::int32_t>(job, count, anview::DataType::int32,
                                           anview::ReduceOp::max, landing);
    }
  }
  if (!shared_possible) {
    job.leave(n);
    return cat("allreduce used ", small, " and ", large, ", reduce_scatter ", scatter,
               " (ranks on several hosts or without shm); results right in and out of place");
  }

  // The last rank calls with one element more, once in shared memory (small) and once direct
  // (large) where the tuner picks it (mp.shm.coll_direct.3 forces it): every rank fails at
  // once with a usage Error naming a peer, and the communicator goes on. Out of place, as
  // collective_algorithm() assumes.
  for (const std::size_t base : {std::size_t{100}, std::size_t{1} << 18}) {
    const std::string algo = job.comm().collective_algorithm("allreduce", base * 4);
    if (algo != "shared" && algo != "direct") continue;  // no mismatch check in the ring
    const std::size_t count = base + (job.rank() == n - 1 ? 1 : 0);
    std::vector<float> data(count, 1.0f), out(count);
    const auto t0 = Clock::now();
    try {
      job.comm().allreduce(data.data(), out.data(), count, anview::DataType::float32,
                           anview::ReduceOp::sum);
      require(false, "an allreduce with mismatched counts (", base, ") succeeded");
    } catch (const Error& e) {
      require(e.kind() == ErrorKind::usage, "expected a usage Error, got ", describe(e));
      require(e.context().peer >= 0 && e.context().peer != job.rank(),
              "the mismatch Error names no peer: ", describe(e));
      require(std::string(e.what()).find("same arguments") != std::string::npos,
              "the mismatch Error does not say what differs: ", describe(e));
      require(seconds_since(t0) < 2.0, "the mismatch took ", seconds_since(t0), " s to report");
    }
    checked_allreduce<float>(job, base, anview::DataType::float32, anview::ReduceOp::sum, false);
  }
  // The same for a direct reduce_scatter: the last rank asks for another operation. Asked
  // again here: `scatter` was the pick of the assumed costs, and the calls above measured them
  // (the ring won it now and then, the check then ran on the ring, which has none).
  const std::string measured_scatter =
      job.comm().collective_algorithm("reduce_scatter", (std::size_t{1} << 20) * n);
  if (measured_scatter == "direct") {
    const std::size_t count = std::size_t{1} << 18;
    std::vector<float> data(count * static_cast<std::size_t>(n), 1.0f), out(count);
    const auto t0 = Clock::now();
    try {
      job.comm().reduce_scatter(
          data.data(), out.data(), count, anview::DataType::float32,
          job.rank() == n - 1 ? anview::ReduceOp::max : anview::ReduceOp::sum);
      require(false, "a reduce_scatter with mismatched operations succeeded");
    } catch (const Error& e) {
      require(e.kind() == ErrorKind::usage && e.context().peer >= 0 &&
                  std::string(e.what()).find("same arguments") != std::string::npos,
              "expected a usage Error naming a peer, got ", describe(e));
      require(seconds_since(t0) < 2.0, "the mismatch took ", seconds_since(t0), " s to report");
    }
    checked_reduce_scatter<float>(job, count, anview::DataType::float32, anview::ReduceOp::sum,
                                  Landing::apart);
  }
  job.leave(n);
  return cat("allreduce used ", small, " and ", large, ", reduce_scatter ", scatter,
             forced.empty() ? "" : " (forced)", " (measured costs: ", measured_scatter, ")",
             "; results right in and out of place; count mismatches failed at once on every ",
             "rank naming a peer, and the next call worked");
}

// coll_runahead: a broadcast's root and a reduce's other ranks publish in their shared area
// and return, so they run ahead of the ranks that read; a rank reuses a header line, ring
// entry or payload slot only once every peer is done with it. Each rank is late now and then
// (a few milliseconds), so the others run ahead as far as the area lets them. Payloads in the
// header line (8 B), in the ring (4 KiB) and in the two slots (16 KiB), roots taking turns,
// allreduces between. (CMake forces broadcast and reduce to `shared`: the tuner may send
// 16 KiB elsewhere.)
std::string coll_runahead(Job& job) {
  const int n = job.size();
  const int me = job.rank();
  auto& comm = job.comm();
  const char* transports = std::getenv("ANVIEW_TRANSPORTS");
  const bool shared =
      transports == nullptr || std::string(transports).find("shm") != std::string::npos;
  for (const char* op : {"broadcast", "reduce"}) {
    const std::string algo = comm.collective_algorithm(op, 8);
    require((algo == "shared") == shared, op, " of 8 B uses ", algo);
  }
  constexpr int rounds = 3000;
  for (const std::size_t count : {std::size_t{2}, std::size_t{1024}, std::size_t{4096}}) {
    std::vector<std::int32_t> data(count), sum(count);
    for (int i = 0; i < rounds; ++i) {
      const int root = i % n;
      if (i % 211 == 37 * me % 211) std::this_thread::sleep_for(std::chrono::milliseconds(3));
      for (std::size_t k = 0; k < count; ++k)
        data[k] = me == root ? static_cast<std::int32_t>(i * 7 + k) : -1;
      comm.broadcast(data.data(), count, anview::DataType::int32, root);
      for (std::size_t k = 0; k < count; ++k)
        require(data[k] == static_cast<std::int32_t>(i * 7 + k), "broadcast ", i, " from ", root,
                " (", count, " int32): element ", k, " is ", data[k]);
      for (std::size_t k = 0; k < count; ++k) data[k] = static_cast<std::int32_t>(i + me + k);
      comm.reduce(data.data(), sum.data(), count, anview::DataType::int32, anview::ReduceOp::sum,
                  root);
      if (me == root) {
        for (std::size_t k = 0; k < count; ++k) {
          const auto want = static_cast<std::int32_t>(n * (i + k) + n * (n - 1) / 2);
          require(sum[k] == want, "reduce ", i, " to ", root, " (", count, " int32): element ", k,
                  " is ", sum[k], ", not ", want);
        }
      }
      if (i % 50 == 0) {
        std::int32_t x = i + me;
        comm.allreduce(&x, 1, anview::DataType::int32, anview::ReduceOp::max);
        require(x == i + n - 1, "allreduce ", i, " gave ", x);
      }
    }
  }
  job.leave(n);
  return cat(rounds,
             " broadcasts and reduces of 8 B, 4 KiB and 16 KiB with rotating roots and late ranks",
             shared ? " through the shared areas" : "", ": every result right");
}

// coll_late (2 ranks, ANVIEW_TIMEOUT=2, ANVIEW_ALGO=allreduce=direct or shared): rank 0
// gives up on a 4 MiB allreduce (its timeout passes) before rank 1 comes. Direct allreduce
// writes into the peers' receive buffers, so rank 1, coming late with rank 0's posting in hand,
// must not write into rank 0's buffer, which is rank 0's again: rank 0 said no-go. The shared
// (staged) one published its first stage before it gave up, and publishes no more. Either way
// rank 1 fails at once naming rank 0, not at its own timeout.
std::string coll_late(Job& job) {
  require(job.size() == 2, "coll_late runs on 2 ranks");
  const char* forced = std::getenv("ANVIEW_ALGO");
  const std::string want = forced != nullptr ? forced : "";
  require(want.rfind("allreduce=", 0) == 0, "coll_late needs ANVIEW_ALGO=allreduce=...");
  const std::size_t count = std::size_t{1} << 20;  // 4 MiB of float32
  std::vector<float> data(count, 1.0f);
  job.comm().allreduce(data.data(), count, anview::DataType::float32, anview::ReduceOp::sum);
  const std::string algo = job.comm().collective_algorithm("allreduce", count * sizeof(float));
  require("allreduce=" + algo == want, "a 4 MiB allreduce uses ", algo, ", not ", want);
  job.barrier(2);
  if (job.rank() == 0) {
    std::fill(data.begin(), data.end(), 7.0f);
    try {
      job.comm().allreduce(data.data(), count, anview::DataType::float32, anview::ReduceOp::sum);
      require(false, "an allreduce without rank 1 succeeded");
    } catch (const Error& e) {
      require(e.kind() == ErrorKind::timeout, "expected a timeout, got ", describe(e));
    }
    job.store().set("late/go", "1");
    job.barrier(2, "late_done");  // rank 1 came and failed
    for (std::size_t i = 0; i < count; ++i)
      require(data[i] == 7.0f, "rank 1 wrote into rank 0's buffer after rank 0 gave up: element ",
              i, " is ", data[i]);
    job.leave(2);
    return "the late rank did not write into the buffer of the rank that gave up";
  }
  job.store().wait({"late/go"}, std::chrono::seconds(60));
  std::fill(data.begin(), data.end(), 3.0f);
  const auto t0 = Clock::now();
  try {
    job.comm().allreduce(data.data(), count, anview::DataType::float32, anview::ReduceOp::sum);
    require(false, "an allreduce whose peer had given up succeeded");
  } catch (const Error& e) {
    require(e.context().peer == 0, "the error names peer ", e.context().peer, ": ", describe(e));
    require(std::string(e.what()).find("gave up") != std::string::npos,
            "the error does not say rank 0 gave up: ", describe(e));
    require(seconds_since(t0) < 1.0, "the late rank took ", seconds_since(t0), " s to fail");
  }
  job.barrier(2, "late_done");
  job.leave(2);
  return "the late rank failed at once naming the rank that gave up";
}

// ------------------------------------------------------------------------------------------
// slowloris: connections that never finish their handshake, on every port, in numbers
// ------------------------------------------------------------------------------------------

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool sanitized = true;
#else
constexpr bool sanitized = false;
#endif

long resident_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  throw Failure("no VmRSS in /proc/self/status");
}

// Rank 0 opens, to the store and to every rank's data ports, 200 connections that never say
// a word and 10 that send one byte of a handshake per round (slow-loris), while every rank
// goes on with checked traffic. The test sets ANVIEW_MAX_PENDING_CONNECTIONS=64 and
// ANVIEW_HANDSHAKE_TIMEOUT=1s: every listener must shed all of them (the oldest as soon as
// more than 64 wait, the rest at their deadline), the traffic must stay correct, and no rank's
// resident memory may grow by more than 16 MiB (96 under ASan, whose quarantine keeps freed
// memory) from before the attack to after it.
std::string slowloris(Job& job) {
  const Pattern pattern(job.seed(), eager_limit + 64);
  const int n = job.size();
  const int me = job.rank();
  constexpr int idlers = 200;
  constexpr int tricklers = 10;
  constexpr int rounds = 25;  // 100 ms apart: well past the handshake timeout
  constexpr auto shed_limit = 10s;
  // ASan keeps freed memory in quarantine (up to 256 MiB), so its RSS says less.
  constexpr long growth_limit_kib = (sanitized ? 96 : 16) * 1024;
  Communicator& comm = job.comm();
  const std::function<void()> pump = [&comm] { comm.progress(); };
  int round = 0;
  traffic_round(job, pattern, round++);  // everything connected and warm
  job.barrier(n);
  const long rss_before = resident_kib();

  std::vector<Target> targets;
  std::vector<std::unique_ptr<RawConn>> idle, slow;
  Bytes opening;  // what the slow ones send, a byte per round
  if (me == 0) {
    rlimit files{};
    ::getrlimit(RLIMIT_NOFILE, &files);
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
    targets = all_targets(job);
    for (const auto& t : targets) {
      for (int i = 0; i < idlers; ++i)
        idle.push_back(std::make_unique<RawConn>(t.address, t.name()));
      for (int i = 0; i < tricklers; ++i)
        slow.push_back(std::make_unique<RawConn>(t.address, t.name()));
    }
    Hello h;
    h.job_id = job_id(job);
    h.world_size = static_cast<std::uint32_t>(n);
    opening = h.encode();
  }
  // The last rank is short of file descriptors: its listener must shed the attack all the
  // same (the oldest pending connection gives way), neither spinning nor waiting for
  // deadlines to free descriptors. Not under the sanitizers: UBSan's type checks open a pipe
  // to probe memory, and with no descriptor left they report a false "invalid vptr".
  if (me == n - 1 && n > 1 && !sanitized) {
    int open_fds = 0;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
      (void)entry;
      ++open_fds;
    }
    rlimit files{};
    ::getrlimit(RLIMIT_NOFILE, &files);
    files.rlim_cur = static_cast<rlim_t>(open_fds + 16);
    require(::setrlimit(RLIMIT_NOFILE, &files) == 0, "setrlimit: ", std::strerror(errno));
  }
  job.barrier(n);
  const auto attack_start = Clock::now();
  for (int i = 0; i < rounds; ++i) {
    if (me == 0)
      for (auto& c : slow) c->send(Bytes{opening[static_cast<std::size_t>(i) % opening.size()]});
    job.progress_for(100ms);
    traffic_round(job, pattern, round++);
  }

  // Rank 0 waits until every hostile connection was closed by its listener; the others wait
  // for its word, which keeps their listeners served.
  const Tag shed_tag{2'000'000};
  std::string summary;
  if (me == 0) {
    const auto deadline = Clock::now() + shed_limit;
    std::size_t open = idle.size() + slow.size();
    while (open > 0 && Clock::now() < deadline) {
      pump();
      open = 0;
      for (auto* group : {&idle, &slow})
        for (auto& c : *group)
          if (c && !c->closed_by_peer()) ++open;
      if (open > 0) std::this_thread::sleep_for(20ms);
    }
    if (open > 0) {
      std::string still;
      for (auto* group : {&idle, &slow})
        for (auto& c : *group)
          if (!c->closed_by_peer() && still.find(c->name()) == std::string::npos)
            still += (still.empty() ? "" : ", ") + c->name();
      throw Failure(cat(open, " of ", idle.size() + slow.size(),
                        " hostile connections were still open ", seconds_since(attack_start),
                        " s after the attack began: ", still));
    }
    summary = cat(idle.size() + slow.size(), " hostile connections to ", targets.size(), " ports (",
                  idlers, " idle and ", tricklers, " slow-loris each) were all shed within ",
                  static_cast<int>(seconds_since(attack_start) * 10) / 10.0, " s");
    idle.clear();
    slow.clear();
    for (int r = 1; r < n; ++r) comm.send(&round, sizeof round, r, shed_tag);
  } else {
    int got = -1;
    comm.recv(&got, sizeof got, 0, shed_tag, 30s);
  }
  traffic_round(job, pattern, round++);
  job.barrier(n);
  const long growth = resident_kib() - rss_before;
  require(growth < growth_limit_kib, "rank ", me, "'s resident memory grew by ", growth / 1024,
          " MiB during the attack (limit ", growth_limit_kib / 1024, " MiB)");
  job.leave(n);
  return cat(summary, summary.empty() ? "" : "; ", "rank ", me, " resident memory ",
             rss_before / 1024, " MiB before, ", growth >= 0 ? "+" : "", growth, " KiB after");
}

// ------------------------------------------------------------------------------------------
// idle: a waiting rank uses no CPU, and wakes as soon as its message comes
// ------------------------------------------------------------------------------------------

double thread_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Rank 1 blocks in a receive while rank 0 naps for half a second, then rank 0 sends: rank 1 must
// have slept (little CPU) and must wake promptly (the transport's wake-up, not a poll interval).
// Once eager-sized, once rendezvous-sized (every step of the handshake wakes a sleeper; small
// enough that the transfer itself, through the ring when CMA is denied, stays short).
std::string idle(Job& job) {
  const int me = job.rank();
  constexpr auto nap = 500ms;  // a rank that spun through it would use about 0.5 s of CPU
  std::string summary;
  job.barrier(job.size());
  for (const std::size_t bytes : {std::size_t{8}, 256 * KiB}) {
    if (me == 0) {
      std::this_thread::sleep_for(nap);
      std::vector<char> message(bytes, 'i');
      const std::int64_t sent_at = Clock::now().time_since_epoch().count();
      std::memcpy(message.data(), &sent_at, sizeof sent_at);
      job.comm().send(message.data(), bytes, 1, Tag{4242});
    } else if (me == 1) {
      std::vector<char> buffer(bytes);
      const double cpu_before = thread_cpu_seconds();
      const Status st = job.comm().recv(buffer.data(), bytes, 0, Tag{4242}, 30s);
      const std::int64_t arrived = Clock::now().time_since_epoch().count();
      const double cpu = thread_cpu_seconds() - cpu_before;
      std::int64_t sent_at = 0;
      std::memcpy(&sent_at, buffer.data(), sizeof sent_at);
      const double delay_ms = static_cast<double>(arrived - sent_at) * 1e-6;
      require(st.bytes == bytes, "the ", bytes, "-byte message arrived with ", st.bytes, " bytes");
      require(cpu < 0.125, "rank 1 used ", cpu, " s of CPU while it waited about 0.5 s for a ",
              bytes, "-byte message: waiting must sleep");
      require(delay_ms < 50, "rank 1 received the ", bytes, "-byte message ", delay_ms,
              " ms after it was sent: a sleeping rank must wake at once");
      summary += cat(bytes, " B: ", static_cast<int>(cpu * 1000), " ms CPU in 0.5 s of waiting, ",
                     "awake ", static_cast<int>(delay_ms * 1000), " us after the send; ");
    }
    job.barrier(job.size());
  }
  // Rank 1's figures go into the summary rank 0 prints: how close a run came to the bounds.
  if (me == 1) job.store().set("check/idle/summary", summary);
  job.barrier(job.size());
  const std::string figures = me == 0 ? job.store().get_string("check/idle/summary") : summary;
  job.leave(job.size());
  return me == 0 ? "rank 1 slept while waiting and woke at once: " + figures : summary;
}

// coll_stall: the last rank stops itself (SIGSTOP) between two allreduces of a loop; rank 0
// continues it (SIGCONT) 2 s later from a helper thread while its own allreduce is stuck. The
// others' hang doctor (ANVIEW_WATCHDOG, set by the test) must name the stopped rank in the
// log meanwhile (multiproc_test reads it); then the loop completes with the right sums.
std::string coll_stall(Job& job) {
  const int me = job.rank();
  const int n = job.size();
  const int victim = n - 1;
  if (me == victim) job.store().set("check/coll_stall/pid", std::to_string(::getpid()));
  job.barrier(n);
  std::thread waker;
  if (me == 0) {
    const long pid = std::stol(job.store().get_string("check/coll_stall/pid"));
    waker = std::thread([pid] {
      const auto deadline = Clock::now() + 20s;
      while (!is_stopped(pid) && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
      std::this_thread::sleep_for(2s);
      ::kill(static_cast<pid_t>(pid), SIGCONT);
    });
  }
  constexpr int rounds = 100;
  for (int i = 0; i < rounds; ++i) {
    if (me == victim && i == rounds / 2) ::raise(SIGSTOP);
    std::int64_t value = me + i;
    job.comm().allreduce(&value, 1, anview::DataType::int64, anview::ReduceOp::sum);
    require(value == static_cast<std::int64_t>(n) * (n - 1) / 2 + static_cast<std::int64_t>(n) * i,
            "allreduce ", i, " gave ", value);
  }
  if (waker.joinable()) waker.join();
  job.leave(n);
  return cat(rounds, " allreduces, rank ", victim, " stopped for 2 s in the middle");
}

// Runs a shell command; its stdout (a non-zero exit fails the check).
std::string run_command(const std::string& command) {
  FILE* pipe = ::popen(command.c_str(), "r");
  require(pipe != nullptr, "cannot run ", command);
  std::string text;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) text.append(buf, n);
  const int status = ::pclose(pipe);
  require(status == 0, command, " exited with status ", status);
  return text;
}

// dump (2 ranks): the flight recorder seen from outside. Both ranks run a few collectives;
// rank 1 then waits in a receive nobody has sent yet. Rank 0 asks for rank 1's state with
// `anview-info --dump PID` (ANVIEW_INFO_PATH) and finds the calls and the pending receive in
// it; then it sends SIGUSR1 to rank 1 and finds the dump file in ANVIEW_DUMP_DIR; then it sends
// the message and both leave.
nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

void check_dumped_state(const nlohmann::json& dump, long pid, const std::string& how) {
  require(dump.at("pid").get<long>() == pid, how, ": pid ", dump.at("pid"), ", not ", pid);
  const auto& comms = dump.at("communicators");
  require(comms.size() == 1, how, ": ", comms.size(), " communicators, not 1");
  const auto& comm = comms.at(0);
  require(comm.at("rank") == 1 && comm.at("size") == 2, how, ": rank/size ", comm.at("rank"), "/",
          comm.at("size"));
  int allreduces = 0;
  bool broadcast = false;
  for (const auto& op : comm.at("collectives")) {
    if (op.at("op") == "allreduce" && op.at("state") == "done" && op.at("bytes") == 64 * 8)
      ++allreduces;
    if (op.at("op") == "broadcast" && op.at("root") == 0 && op.at("state") == "done")
      broadcast = true;
  }
  require(allreduces == 3 && broadcast, how,
          ": the 3 allreduces and the broadcast are not all "
          "recorded as done: ",
          comm.at("collectives").dump());
  bool pending = false;
  for (const auto& r : comm.at("pending_p2p"))
    pending = pending || (r.at("kind") == "recv" && r.value("tag", nlohmann::json()) == 77 &&
                          r.at("peer") == "any");
  require(pending, how,
          ": the pending receive (any source, tag 77) is missing: ", comm.at("pending_p2p").dump());
}

std::string dump(Job& job) {
  const int me = job.rank();
  require(job.size() == 2, "dump runs on 2 ranks");
  std::vector<double> values(64, me + 1.0);
  for (int i = 0; i < 3; ++i)
    job.comm().allreduce(values.data(), values.size(), anview::DataType::float64,
                         anview::ReduceOp::sum);
  job.comm().broadcast(values.data(), values.size(), anview::DataType::float64, 0);
  std::string summary;
  if (me == 1) {
    char byte = 0;
    auto request = job.comm().irecv(&byte, 1, anview::any_source, Tag{77});
    job.store().set("check/dump/pid", std::to_string(::getpid()));
    request.wait(60s);
    require(byte == 'x', "the last message carries '", byte, "'");
  } else {
    const long pid = std::stol(job.store().get_string("check/dump/pid"));
    const char* info = std::getenv("ANVIEW_INFO_PATH");
    const char* dir = std::getenv("ANVIEW_DUMP_DIR");
    require(info != nullptr && dir != nullptr, "ANVIEW_INFO_PATH and ANVIEW_DUMP_DIR must be set");
    // 1. On request: by pid, and among every process of this host.
    for (const std::string& pids : {std::to_string(pid), std::string()}) {
      const std::string command = std::string(info) + " --dump " + pids;
      const auto all = nlohmann::json::parse(run_command(command));
      bool found_self = false, found_peer = false;
      for (const auto& d : all) {
        found_self = found_self || d.at("pid") == ::getpid();
        if (d.at("pid") == pid) {
          found_peer = true;
          check_dumped_state(d, pid, command);
        }
      }
      require(found_peer && (!pids.empty() || found_self), command, " lacks ",
              found_peer ? "this process" : "rank 1's process");
    }
    // 2. On SIGUSR1: a file.
    const std::string path = std::string(dir) + "/anview-dump-" + std::to_string(pid) + ".json";
    std::remove(path.c_str());
    require(::kill(static_cast<pid_t>(pid), SIGUSR1) == 0, "kill(SIGUSR1): ", std::strerror(errno));
    const auto deadline = Clock::now() + 20s;
    while (::access(path.c_str(), R_OK) != 0) {
      require(Clock::now() < deadline, "no dump at ", path, " 20 s after SIGUSR1");
      std::this_thread::sleep_for(10ms);
    }
    const auto file = read_json_file(path);
    require(file.at("reason") == "SIGUSR1", "the dump's reason is ", file.at("reason"));
    check_dumped_state(file, pid, path);
    std::remove(path.c_str());
    summary = "anview-info --dump and SIGUSR1 showed rank 1's calls and pending receive";
    const char byte = 'x';
    job.comm().send(&byte, 1, 1, Tag{77});
  }
  job.leave(2);
  return summary;
}

// metrics (2 ranks): rank 0 scrapes rank 1's endpoint (ANVIEW_METRICS_PORT + 1) with curl
// between two rounds of allreduces and messages: the counters grow by what was done, and the
// text parses with Prometheus' own parser (python3-prometheus-client) when it is installed.

// The sum of the samples of `name` whose labels contain every one of `labels`.
double sample_sum(const std::string& text, const std::string& name,
                  const std::vector<std::string>& labels) {
  double sum = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#' || line.rfind(name + "{", 0) != 0) continue;
    bool all = true;
    for (const auto& l : labels) all = all && line.find(l) != std::string::npos;
    if (all) sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

std::string metrics(Job& job) {
  const int me = job.rank();
  require(job.size() == 2, "metrics runs on 2 ranks");
  const char* port = std::getenv("ANVIEW_METRICS_PORT");
  require(port != nullptr, "ANVIEW_METRICS_PORT must be set");
  const std::string url = cat("http://127.0.0.1:", std::stoi(port) + 1, "/metrics");
  constexpr int allreduces = 50, messages = 20;
  auto round = [&] {
    for (int i = 0; i < allreduces; ++i) {
      std::int64_t v = me;
      job.comm().allreduce(&v, 1, anview::DataType::int64, anview::ReduceOp::sum);
    }
    char byte = 'm';
    for (int i = 0; i < messages; ++i) {
      if (me == 0)
        job.comm().send(&byte, 1, 1, Tag{9});
      else
        job.comm().recv(&byte, 1, 0, Tag{9});
    }
    job.comm().barrier();
  };
  round();
  std::string first, second;
  if (me == 0) first = run_command("curl -sf --max-time 10 " + url);
  job.comm().barrier();
  round();
  std::string summary;
  if (me == 0) {
    second = run_command("curl -sf --max-time 10 " + url);
    const std::vector<std::string> allreduce_labels = {"rank=\"1\"", "op=\"allreduce\""};
    const double calls1 = sample_sum(first, "anview_collective_calls_total", allreduce_labels);
    const double calls2 = sample_sum(second, "anview_collective_calls_total", allreduce_labels);
    require(calls1 >= allreduces && calls2 - calls1 >= allreduces,
            "rank 1's allreduce calls: ", calls1, " then ", calls2);
    const std::vector<std::string> received = {"rank=\"1\"", "peer=\"0\"",
                                               "direction=\"received\""};
    const double m1 = sample_sum(first, "anview_p2p_messages_total", received);
    const double m2 = sample_sum(second, "anview_p2p_messages_total", received);
    require(m2 - m1 >= messages, "rank 1's received messages from rank 0: ", m1, " then ", m2);
    require(
        sample_sum(second, "anview_collective_latency_seconds_count", allreduce_labels) == calls2,
        "the latency histogram counts every allreduce");
    summary = cat("rank 1's allreduce calls ", calls1, " -> ", calls2, ", messages from rank 0 ",
                  m1, " -> ", m2);
    const char* result_dir =
        job.options().result_dir.empty() ? "/tmp" : job.options().result_dir.c_str();
    const std::string path = cat(result_dir, "/metrics-", ::getpid(), ".txt");
    { std::ofstream(path) << second; }
    if (::system("/usr/bin/python3 -c 'import prometheus_client' 2>/dev/null") == 0) {
      const std::string families = run_command(
          "/usr/bin/python3 -c 'import sys; from prometheus_client.parser import "
          "text_string_to_metric_families as p; print(len(list(p(sys.stdin.read()))))' < " +
          path);
      require(std::stoi(families) >= 10, "the Prometheus parser read ", families, " families");
      summary += cat("; Prometheus' parser read ", std::stoi(families), " families");
    } else {
      summary += "; python3-prometheus-client missing: format not checked by its parser";
    }
    std::remove(path.c_str());
    const auto json = nlohmann::json::parse(run_command(
        "curl -sf --max-time 10 " + cat("http://127.0.0.1:", std::stoi(port), "/metrics.json")));
    require(!json.at("metrics").empty(), "rank 0's /metrics.json is empty");
  }
  job.comm().barrier();
  job.leave(2);
  return summary;
}

// p2p_stall (2 ranks): rank 0 waits in a blocking receive while rank 1 sleeps 1.5 s before it
// sends. With ANVIEW_WATCHDOG below that (set by the test), rank 0's hang doctor logs which
// receive waits for whom, on which link, and dumps the flight recorder; then the message
// arrives and the job ends normally.
std::string p2p_stall(Job& job) {
  const int me = job.rank();
  require(job.size() == 2, "p2p_stall runs on 2 ranks");
  job.barrier(2);
  std::int64_t value = 0;
  if (me == 1) {
    std::this_thread::sleep_for(1500ms);
    value = 77;
    job.comm().send(&value, sizeof value, 0, Tag{5});
  } else {
    job.comm().recv(&value, sizeof value, 1, Tag{5}, 30s);
    require(value == 77, "received ", value);
  }
  job.leave(2);
  return "a receive waited 1.5 s for its message";
}

// Steps a TLS handshake on a raw connection until it is done or failed, driving `pump` (the
// attacked port may be our own).
anview::base::tls::Session::Step tls_handshake(anview::base::tls::Session& session, int fd,
                                               const std::function<void()>& pump) {
  using Step = anview::base::tls::Session::Step;
  const auto end = Clock::now() + drop_limit;
  for (;;) {
    const Step step = session.handshake();
    if (step == Step::done || step == Step::failed || Clock::now() >= end) return step;
    pump();
    pollfd p{fd, static_cast<short>(step == Step::want_write ? POLLOUT : POLLIN), 0};
    ::poll(&p, 1, 2);
  }
}

// Reads through the session until the peer closes or `drop_limit` passes: true when it closed
// having sent no application data.
bool tls_closed_silently(anview::base::tls::Session& session, int fd,
                         const std::function<void()>& pump, std::size_t* got) {
  const auto end = Clock::now() + drop_limit;
  *got = 0;
  while (Clock::now() < end) {
    char chunk[4096];
    const ssize_t n = session.read(chunk, sizeof chunk);
    if (n > 0) *got += static_cast<std::size_t>(n);
    if (n == 0 || (n < 0 && errno != EAGAIN)) return *got == 0;
    pump();
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, 2);
  }
  return false;
}

std::string tls_garbage(Job& job) {
  namespace tls = anview::base::tls;
  const char* on = std::getenv("ANVIEW_TLS");
  require(on != nullptr && std::string(on) == "1", "tls_garbage runs with ANVIEW_TLS=1");
  const Pattern pattern(job.seed(), eager_limit + 64);
  const int n = job.size();
  std::vector<Target> targets;
  if (job.rank() == 0) targets = all_targets(job);
  job.barrier(n);
  Communicator& comm = job.comm();
  const std::function<void()> pump = [&comm] { comm.progress(); };
  std::mt19937_64 rng(job.seed());
  int round = 0;
  std::string done;

  random_bytes_round(job, pattern, round, rng, pump, targets, done);

  attack_round(
      job, pattern, round, "plain text from an Anview peer without TLS",
      [&](const Target& t, RawConn& c, const std::string& what) {
        if (t.rank < 0) {
          Bytes b = store_header(sp::magic, sp::version, 2, 0, 1, 5);  // get "k"
          b.insert(b.end(), {1, 0, 0, 0, 'k'});
          c.send(b);
          expect_store_error(c.read_until_close(drop_limit, pump), sp::Status::bad_request, what);
        } else {
          Hello h;
          h.job_id = job_id(job);
          h.world_size = static_cast<std::uint32_t>(n);
          c.send(h.encode());
          expect_reject(c.read_until_close(drop_limit, pump), hs::RejectReason::tls, what);
        }
      },
      targets, done);

  attack_round(
      job, pattern, round, "a TLS record header over garbage",
      [&](const Target&, RawConn& c, const std::string& what) {
        Bytes b = random_bytes(rng, 200);
        b[0] = 0x16;
        b[1] = 0x03;
        b[2] = 0x01;
        b[3] = 0x00;  // a 64-byte record, all there: no waiting for the rest of it
        b[4] = 0x40;
        c.send(b);
        // Closed with at most a TLS alert (record type 21, 2 bytes of alert): nothing else.
        const RawConn::Outcome o = c.read_until_close(drop_limit, pump);
        require(o.end != RawConn::End::open, what, ": the connection was not closed within ",
                drop_limit.count(), " ms");
        require(o.reply.empty() || (o.reply.size() == 7 && o.reply[0] == 0x15), what,
                ": expected no reply or a TLS alert, got ", o.reply.size(), " bytes");
      },
      targets, done);

  const auto other_key = tls::Context::make({}, anview::base::auth::Secret("not the job's"));
  attack_round(
      job, pattern, round, "TLS with a key from another secret",
      [&](const Target&, RawConn& c, const std::string& what) {
        ::fcntl(c.fd(), F_SETFL, ::fcntl(c.fd(), F_GETFL) | O_NONBLOCK);
        tls::Session session(*other_key, c.fd(), tls::Role::client);
        const auto step = tls_handshake(session, c.fd(), pump);
        require(step == tls::Session::Step::failed, what, ": the handshake did not fail");
        c.read_until_close(drop_limit, pump);
      },
      targets, done);

  const auto job_key =
      tls::Context::from_environment(anview::base::auth::Secret::from_environment());
  attack_round(
      job, pattern, round, "garbage inside a TLS session with the job's key",
      [&](const Target&, RawConn& c, const std::string& what) {
        ::fcntl(c.fd(), F_SETFL, ::fcntl(c.fd(), F_GETFL) | O_NONBLOCK);
        tls::Session session(*job_key, c.fd(), tls::Role::client);
        const auto step = tls_handshake(session, c.fd(), pump);
        require(step == tls::Session::Step::done, what,
                ": the handshake failed: ", session.failure());
        Bytes b = random_bytes(rng, 300);
        b[0] = 0xFF;
        require(session.write(b.data(), b.size()) == static_cast<ssize_t>(b.size()), what,
                ": could not write through TLS");
        std::size_t got = 0;
        require(tls_closed_silently(session, c.fd(), pump, &got), what,
                ": expected the connection closed without a reply, got ", got, " bytes");
      },
      targets, done);
  job.leave(n);
  return cat(targets.size(), " TLS ports (store + data) survived: ", done, "; ", round,
             " rounds of traffic and store round-trips after them");
}

#if defined(ANVIEW_HAVE_UCX)
// ucx_garbage (ANVIEW_TRANSPORTS=ucx): a stranger inside rank 1's process — its own UCP worker
// and an endpoint to rank 0's worker (address from the store) — sends rank 0 active messages
// no rank would send: a header of an unknown size, a frame naming no rank of the job, a hello
// of another job, a goodbye with a bad magic. Rank 0 drops them (logged once) and every pair
// goes on talking.
std::string ucx_garbage(Job& job) {
  namespace ucx = anview::transport::ucx;
  const Pattern pattern(job.seed(), eager_limit + 64);
  const int n = job.size();
  require(n >= 2, "ucx_garbage needs 2 ranks or more");
  require(job.comm().transport_name(1 % n) == "ucx" || job.rank() != 0,
          "rank 0 does not reach rank 1 over ucx (", job.comm().describe_peer(1), ")");
  traffic_round(job, pattern, 0);
  constexpr Tag sent{777};
  if (job.rank() == 0) {
    char note = 0;
    job.comm().recv(&note, 1, 1, sent);  // drives progress while the stranger talks
  } else if (job.rank() == 1) {
    const auto record = nlohmann::json::parse(job.store().get_string("anview/peer/0"));
    ucx::Endpoint endpoint;
    std::string why;
    require(
        ucx::decode_endpoint(record.at("endpoints").at("ucx").get<std::string>(), endpoint, &why),
        "rank 0's ucx endpoint: ", why);
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM;
    ucp_context_h context = nullptr;
    require(ucp_init(&params, nullptr, &context) == UCS_OK, "ucp_init failed");
    ucp_worker_params_t worker_params{};
    ucp_worker_h worker = nullptr;
    require(ucp_worker_create(context, &worker_params, &worker) == UCS_OK, "worker failed");
    ucp_ep_params_t ep_params{};
    ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep_params.address = reinterpret_cast<const ucp_address_t*>(endpoint.worker_address.data());
    ucp_ep_h ep = nullptr;
    require(ucp_ep_create(worker, &ep_params, &ep) == UCS_OK, "ucp_ep_create failed");
    ucx::AmHeader stray;
    stray.source = 99;  // no rank of the job
    stray.frame.type = 1;
    stray.frame.payload_bytes = 5;
    ucx::Hello foreign;
    foreign.job_id = job_id(job) + 1;
    foreign.rank = 1;
    foreign.world_size = static_cast<std::uint32_t>(n);
    ucx::Bye bad_bye;
    bad_bye.magic = 0x12345678;
    bad_bye.rank = 1;
    const char odd_header[10] = "garbage!!";
    const char payload[5] = {1, 2, 3, 4, 5};
    struct Attack {
      unsigned id;
      const void* header;
      std::size_t header_bytes;
      const void* data;
      std::size_t bytes;
    };
    const Attack attacks[] = {{ucx::am_frame, odd_header, sizeof odd_header, payload, 5},
                              {ucx::am_frame, &stray, sizeof stray, payload, 5},
                              {ucx::am_hello, &foreign, sizeof foreign, nullptr, 0},
                              {ucx::am_bye, &bad_bye, sizeof bad_bye, nullptr, 0}};
    std::vector<ucs_status_ptr_t> pending;
    for (const Attack& a : attacks) {
      ucp_request_param_t param{};
      const ucs_status_ptr_t r =
          ucp_am_send_nbx(ep, a.id, a.header, a.header_bytes, a.data, a.bytes, &param);
      require(!UCS_PTR_IS_ERR(r), "ucp_am_send_nbx: ", ucs_status_string(UCS_PTR_STATUS(r)));
      if (r != nullptr) pending.push_back(r);
    }
    ucp_request_param_t flush_param{};
    pending.push_back(ucp_ep_flush_nbx(ep, &flush_param));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (ucs_status_ptr_t r : pending) {
      if (r == nullptr || UCS_PTR_IS_ERR(r)) continue;
      while (ucp_request_check_status(r) == UCS_INPROGRESS) {
        require(std::chrono::steady_clock::now() < deadline, "the stranger's messages hang");
        ucp_worker_progress(worker);
        job.comm().progress();
      }
      ucp_request_free(r);
    }
    ucp_request_param_t close_param{};
    close_param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    close_param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    const ucs_status_ptr_t closing = ucp_ep_close_nbx(ep, &close_param);
    if (closing != nullptr && !UCS_PTR_IS_ERR(closing)) {
      while (ucp_request_check_status(closing) == UCS_INPROGRESS) ucp_worker_progress(worker);
      ucp_request_free(closing);
    }
    ucp_worker_destroy(worker);
    ucp_cleanup(context);
    const char note = 1;
    job.comm().send(&note, 1, 0, sent);
  }
  traffic_round(job, pattern, 1);
  job.leave(n);  // rank 0 serves the store the others still read in the round above
  return cat("rank 0 dropped 4 stranger messages (unknown header, frame of rank 99, hello of ",
             "another job, bad goodbye) and every pair still talks");
}
#endif

const std::map<std::string, std::string (*)(Job&)> scenarios = {
    {"stress", stress},
    {"wildcards", wildcards},
    {"ordering", ordering},
    {"outstanding", outstanding},
    {"timeout", timeout},
    {"kill", kill_rank},
    {"stop", stop},
    {"garbage", garbage},
    {"tls_garbage", tls_garbage},
    {"version", version},
    {"idle", idle},
    {"slowloris", slowloris},
    {"coll_kill", coll_kill},
    {"one_sided", one_sided},
    {"rma_kill", rma_kill},
    {"coll_direct", coll_direct},
    {"coll_late", coll_late},
    {"coll_runahead", coll_runahead},
    {"coll_stall", coll_stall},
    {"dump", dump},
    {"metrics", metrics},
    {"p2p_stall", p2p_stall},
#if defined(ANVIEW_HAVE_UCX)
    {"ucx_garbage", ucx_garbage},
#endif
};

int usage(const std::string& why) {
  std::fprintf(stderr,
               "anview_p2p_check: %s\n"
               "usage: anview-run -n N anview_p2p_check SCENARIO [--seed S] [--result-dir DIR] "
               "[--preload BYTES] [--hosts K] [--deny-cma] [--deny-pidfd]\n"
               "scenarios: stress wildcards ordering outstanding timeout kill stop garbage "
               "tls_garbage version slowloris idle\n",
               why.c_str());
  return 2;
}

void write_result(const Options& options, int rank, const std::string& line) {
  if (options.result_dir.empty() || rank < 0) return;
  std::ofstream out(options.result_dir + "/rank" + std::to_string(rank) + ".result");
  out << line << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (argc < 2) return usage("no scenario given");
  options.scenario = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--seed" && i + 1 < argc) {
      options.seed = std::stoull(argv[++i]);
    } else if (arg == "--result-dir" && i + 1 < argc) {
      options.result_dir = argv[++i];
    } else if (arg == "--preload" && i + 1 < argc) {
      options.preload_bytes = std::stoull(argv[++i]);
    } else if (arg == "--hosts" && i + 1 < argc) {
      options.hosts = std::atoi(argv[++i]);
    } else if (arg == "--deny-cma") {
      options.deny_cma = true;
    } else if (arg == "--deny-pidfd") {
      options.deny_pidfd = true;
    } else {
      return usage("unknown argument '" + arg + "'");
    }
  }
  const auto it = scenarios.find(options.scenario);
  if (it == scenarios.end()) return usage("unknown scenario '" + options.scenario + "'");

  int rank = -1;
  if (const char* r = std::getenv("ANVIEW_RANK")) rank = std::atoi(r);
  const auto start = Clock::now();
  try {
    if (options.hosts > 0) {
      const char* size_text = std::getenv("ANVIEW_WORLD_SIZE");
      const int world = size_text ? std::atoi(size_text) : 0;
      require(rank >= 0 && world > 0, "--hosts needs ANVIEW_RANK and ANVIEW_WORLD_SIZE");
      ::setenv("ANVIEW_HOST_ID",
               anview::bootstrap::emulated_host(rank, world, options.hosts).id.c_str(), 1);
    }
    if (options.deny_cma) deny_cross_memory_attach();
    if (options.deny_pidfd) deny_pidfd();
    std::string summary;
    int size = 0;
    {
      Job job(options);
      rank = job.rank();
      size = job.size();
      summary = it->second(job);
    }  // the communicator closes here, before we report success
    write_result(options, rank, "OK " + summary);
    if (rank == 0) {
      std::printf("anview_p2p_check %s: OK on %d ranks: %s (%.2f s in all)\n",
                  options.scenario.c_str(), size, summary.c_str(), seconds_since(start));
      std::fflush(stdout);
    }
    return 0;
  } catch (const Error& e) {
    const std::string why = describe(e);
    write_result(options, rank, "FAIL " + why);
    std::fprintf(stderr, "anview_p2p_check %s: rank %d FAILED: %s\n", options.scenario.c_str(),
                 rank, why.c_str());
  } catch (const std::exception& e) {
    write_result(options, rank, std::string("FAIL ") + e.what());
    std::fprintf(stderr, "anview_p2p_check %s: rank %d FAILED: %s\n", options.scenario.c_str(),
                 rank, e.what());
  }
  return 1;
}
