// The collectives of one communicator: argument checks, the choice of algorithm, and the
// sequence number that gives each call its own reserved tag. Blocking; every step waits with
// the communicator's timeout, and a failure names the call ("allreduce #12"), the peer and the
// cause.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "anview/collectives.hpp"
#include "collectives/algorithms.hpp"
#include "collectives/cost_model.hpp"
#include "collectives/direct.hpp"
#include "collectives/flight_recorder.hpp"
#include "collectives/hierarchical.hpp"
#include "collectives/shared.hpp"
#include "p2p/messenger.hpp"

namespace anview::collectives {

class Collectives {
 public:
  // Reads ANVIEW_ALGO, ANVIEW_COLL_CHUNK and ANVIEW_WATCHDOG once, here.
  explicit Collectives(p2p::Messenger& messenger);

  // The hang doctor every call's steps report long waits to (watchdog.hpp); set before the
  // first call, must outlive this object.
  void set_stall_reporter(StallReporter* reporter) { reporter_ = reporter; }

  void allreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op);
  void broadcast(void* data, std::size_t count, DataType type, int root);
  void reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
              int root);
  void allgather(const void* send, void* recv, std::size_t count, DataType type);
  void reduce_scatter(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op);
  void gather(const void* send, void* recv, std::size_t count, DataType type, int root);
  void scatter(const void* send, void* recv, std::size_t count, DataType type, int root);
  void alltoall(const void* send, void* recv, std::size_t count, DataType type);
  // v-variants: counts (and displacements, empty for packed) in elements, one per rank.
  void allgatherv(const void* send, std::size_t send_count, void* recv,
                  std::span<const std::size_t> recv_counts, std::span<const std::size_t> displs,
                  DataType type);
  void gatherv(const void* send, std::size_t send_count, void* recv,
               std::span<const std::size_t> recv_counts, std::span<const std::size_t> displs,
               DataType type, int root);
  void scatterv(const void* send, std::span<const std::size_t> send_counts,
                std::span<const std::size_t> displs, void* recv, std::size_t recv_count,
                DataType type, int root);
  void alltoallv(const void* send, std::span<const std::size_t> send_counts,
                 std::span<const std::size_t> send_displs, void* recv,
                 std::span<const std::size_t> recv_counts, std::span<const std::size_t> recv_displs,
                 DataType type);
  void barrier();

  // The algorithm a collective ("allreduce", "broadcast", ...) of `bytes` (float32) uses, and
  // why (ANVIEW_ALGO, or the tuner's predictions); empty for an unknown collective. Before the
  // job has measured its costs the predictions use assumed ones (and say so).
  std::string algorithm(std::string_view collective, std::size_t bytes, std::string* why) const;
  // Every candidate with its predicted time or why it cannot run, the pick and the costs, as
  // text (empty for an unknown collective). A collective: measures the costs the first time.
  std::string explain(std::string_view collective, std::size_t bytes);

  // The latest calls (flight_recorder.hpp); read from any thread.
  const FlightRecorder& recorder() const { return recorder_; }

 private:
  // What placement lets the same-host algorithms do, as bits: every peer's memory readable
  // (direct), every peer's shared area mapped (shared). Agreed with the hosts (layout_).
  static constexpr int reads_peers = 1;
  static constexpr int shares_memory = 2;
  // This rank's view (fills peer_memories_ and shared_areas_ the first time).
  int local_placement() const;
  // What holds for every rank: agreed by all ranks the first time a call could use a
  // same-host algorithm (a collective of its own), then remembered.
  int placement() {
    const int agreed = agreed_placement_.load(std::memory_order_acquire);
    return agreed >= 0 ? agreed : agree_placement();
  }
  int agree_placement();
  // The agreed bits if agreed, else this rank's view (for reports before the first call).
  bool placement_allows(int bit) const;
  // A new call, recorded with this rank's `bytes` and the root (-1: none).
  Call begin(const char* name, std::size_t bytes = 0, int root = -1);
  // `count` elements of `type` in bytes, saturated (for the record: checked later).
  static std::size_t record_bytes(std::size_t count, DataType type) {
    std::size_t bytes = 0;  // no division: this runs at every call
    return __builtin_mul_overflow(count, size_of(type), &bytes)
               ? std::numeric_limits<std::size_t>::max()
               : bytes;
  }
  [[noreturn]] void usage(const Call& call, const std::string& cause) const;
  struct Forced;
  // What ANVIEW_ALGO forces for `collective` (its first item for it), or null: none, or an
  // empty algorithm ("broadcast=": the tuner's pick).
  const Forced* forced_for(std::string_view collective) const;
  // A usage error when ANVIEW_ALGO forces an algorithm the call's collective does not have.
  // (The checks run at every call: inline where they pass, out of line where they fail.)
  void check_known(const Call& call) const {
    if (!forced_.empty()) check_forced_known(call);
  }
  void check_forced_known(const Call& call) const;
  // A usage error where placement or size rules out `algo` (forced by ANVIEW_ALGO) for a call
  // moving `bytes` per rank.
  void check_runs(const Call& call, const std::string& algo, std::size_t bytes) const;
  // What the tuner weighs: the ranks, the agreed placement, the chunk size.
  Topology topology(std::size_t element_bytes) const;
  // The measured costs once measured, else assumed ones (for reports only).
  CostModel current_model() const;
  // Measures the costs (a collective of its own) unless done.
  void measure_costs();
  // The algorithm of a call: forced (a usage error where it cannot run), else the tuner's pick,
  // measuring the costs first when there is a choice. `bytes` as in candidates(); `per_rank`
  // what each rank contributes (the shared slots' limit applies to it). Valid until the next
  // call of choose(). `collective` is a string literal (its address identifies it).
  std::string_view choose(const Call& call, std::string_view collective, std::size_t bytes,
                          std::size_t element_bytes, std::size_t per_rank) {
    // The last pick again, when nothing it depends on can differ (programs repeat a call):
    // decided inline, without the call below.
    const Decision& d = decisions_[last_decision_];
    if (d.name_seen == collective.data() && d.same_numbers(Step::whole, bytes, element_bytes) &&
        forced_.empty() && model_ && agreed_placement_.load(std::memory_order_acquire) >= 0) {
      call.record.algorithm(d.recorded);
      return d.algorithm;
    }
    return choose_anew(call, collective, bytes, element_bytes, per_rank);
  }
  const std::string& choose_anew(const Call& call, std::string_view collective, std::size_t bytes,
                                 std::size_t element_bytes, std::size_t per_rank);
  // The flat algorithm of `collective` that a step of a hierarchical one runs: among the
  // hosts' leaders, or inside each host (the same for every rank: agreed topology and model).
  // Remembered like choose()'s picks, so a repeated call predicts nothing.
  const std::string& step_algorithm(std::string_view collective, std::size_t bytes,
                                    std::size_t element_bytes, bool inside_host);
  // The pick with the costs as they are (no measuring), and why.
  std::string pick(std::string_view collective, std::size_t bytes, std::size_t element_bytes,
                   std::string* why) const;
  void check_root(const Call& call, int root) const {
    if (root < 0 || root >= call.size) bad_root(call, root);
  }
  [[noreturn]] void bad_root(const Call& call, int root) const;
  // count elements of type in bytes; a usage error for an unknown type or where count * its
  // size * the ranks overflows (the gathering kinds hold a block per rank).
  std::size_t checked_bytes(const Call& call, std::size_t count, DataType type) const {
    std::size_t bytes = 0, all = 0;
    if (size_of(type) == 0 || __builtin_mul_overflow(count, size_of(type), &bytes) ||
        __builtin_mul_overflow(bytes, static_cast<std::size_t>(call.size), &all))
      bad_count(call, count, type);
    return bytes;
  }
  [[noreturn]] void bad_count(const Call& call, std::size_t count, DataType type) const;
  void check_buffer(const Call& call, const void* p, std::size_t bytes, const char* which) const {
    if (p == nullptr && bytes > 0) null_buffer(call, which);
  }
  [[noreturn]] void null_buffer(const Call& call, const char* which) const;
  // Per-rank blocks from counts and displacements (elements; empty displacements: packed in
  // rank order), checked: one entry per rank, no overflow.
  Blocks checked_blocks(const Call& call, std::span<const std::size_t> counts,
                        std::span<const std::size_t> displs, DataType type,
                        const char* which) const;
  // The root's blocks of a gatherv/scatterv (empty elsewhere), checked with its own block
  // (`own_bytes`) and its buffer.
  Blocks root_blocks(const Call& call, std::span<const std::size_t> counts,
                     std::span<const std::size_t> displs, DataType type, std::size_t own_bytes,
                     const void* buffer, const char* which, int root) const;
  // The bytes a buffer holding `blocks` needs.
  static std::size_t total_bytes(const Blocks& blocks);

  p2p::Messenger& messenger_;
  std::uint64_t sequence_ = 0;
  // ANVIEW_ALGO's items, checked against each collective's algorithms when read.
  struct Forced {
    std::string collective;
    std::string algorithm;
    const char* recorded = nullptr;  // `algorithm` as the flight recorder takes it
    bool known = true;  // the collective has that algorithm (else `names` lists those it has)
    std::string names;
  };
  static std::vector<Forced> read_forced();  // choice.cpp holds the choosing
  std::vector<Forced> forced_;
  // Placement state is read by algorithm() from any thread while collectives run on another
  // (the nonblocking collectives' worker): set once (call_once), agreed once (atomic, -1 until).
  mutable std::once_flag placement_once_;
  mutable int local_placement_ = 0;
  mutable PeerMemories peer_memories_;
  mutable SharedAreas shared_areas_;
  std::atomic<int> agreed_placement_{-1};
  HostLayout layout_;                   // set with the agreed placement (before it is published)
  std::uint64_t shared_calls_ = 0;      // numbers the shared-memory calls (shared.hpp)
  std::size_t chunk_bytes_;             // ANVIEW_COLL_CHUNK
  std::chrono::milliseconds watchdog_;  // ANVIEW_WATCHDOG
  StallReporter* reporter_ = nullptr;
  FlightRecorder recorder_;  // ANVIEW_FLIGHT_RECORDER
  // After recorder_: unregisters before the recorder it reads goes away.
  base::metrics::Group metrics_;
  // The measured costs, agreed by all ranks; read by algorithm() from any thread.
  mutable std::mutex model_mu_;
  std::optional<CostModel> model_;  // written only by the collectives' thread
  // Recent picks, reused while calls look the same (programs repeat a few sizes): a small call
  // pays a few comparisons, not a prediction.
  // `step`: the whole call, or one step of its hierarchical form (step_algorithm).
  enum class Step : std::uint8_t { whole, among_hosts, inside_host };
  struct Decision {
    std::string collective;
    // The text the caller named it with (a string literal): the same address is the same
    // name, told without comparing the characters.
    const char* name_seen = nullptr;
    Step step = Step::whole;
    std::size_t bytes = 0;
    std::size_t element_bytes = 0;
    std::string algorithm;
    const char* recorded = nullptr;  // `algorithm` as the flight recorder takes it

    bool same_numbers(Step s, std::size_t b, std::size_t e) const {
      return bytes == b && element_bytes == e && step == s;
    }
  };
  // The remembered pick for a call that looks like this one, or null.
  const Decision* recall(std::string_view collective, Step step, std::size_t bytes,
                         std::size_t element_bytes) const;
  const std::string& remember(Decision decision);
  std::array<Decision, 8> decisions_;
  std::size_t next_decision_ = 0;          // the one to replace next
  mutable std::size_t last_decision_ = 0;  // the one recall() found last
  std::vector<p2p::RequestPtr> posted_;    // the current call's requests
  std::vector<char> scratch_;              // the current call's incoming data
  // A copy of the current call's input, for algorithms that work on it in place (kept: a
  // fresh allocation of 32 MiB or more is a fresh mapping whose page faults cost more than the
  // collective itself).
  std::vector<char> work_;
  char* work_buffer(std::size_t bytes);  // room for `bytes`, contents undefined
  char* work_copy(const void* from, std::size_t bytes);
};

}  // namespace anview::collectives
