// The collectives of one communicator: argument checks, the choice of algorithm, and the
// sequence number that gives each call its own reserved tag. Blocking; every step waits with
// the communicator's timeout, and a failure names the call ("allreduce #12"), the peer and the
// cause.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "anview/collectives.hpp"
#include "collectives/algorithms.hpp"
#include "collectives/direct.hpp"
#include "collectives/shared.hpp"
#include "p2p/messenger.hpp"

namespace anview::collectives {

class Collectives {
 public:
  // Reads ANVIEW_ALGO and ANVIEW_ALLREDUCE_SMALL_BYTES once, here.
  explicit Collectives(p2p::Messenger& messenger);

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

  // The algorithm allreduce uses for `bytes` (ANVIEW_ALGO, or the size rule), and why.
  std::string allreduce_choice(std::size_t bytes, std::string* why) const;
  // The same for any collective by name ("allreduce", "broadcast", ...); empty if unknown.
  std::string algorithm(std::string_view collective, std::size_t bytes, std::string* why) const;

 private:
  // What placement lets the same-host algorithms do, as bits: every peer's memory readable
  // (direct), every peer's shared area mapped (shared).
  static constexpr int reads_peers = 1;
  static constexpr int shares_memory = 2;
  // This rank's view (fills peer_memories_ and shared_areas_ the first time).
  int local_placement() const;
  // What holds for every rank: agreed by all ranks the first time a call could use a
  // same-host algorithm (a collective of its own), then remembered.
  int placement();
  // The agreed bits if agreed, else this rank's view (for reports before the first call).
  bool placement_allows(int bit) const;
  Call begin(const char* name);
  [[noreturn]] void usage(const Call& call, const std::string& cause) const;
  void check_root(const Call& call, int root) const;
  std::size_t checked_bytes(const Call& call, std::size_t count, DataType type) const;
  void check_buffer(const Call& call, const void* p, std::size_t bytes, const char* which) const;
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
  std::string forced_allreduce_;  // from ANVIEW_ALGO
  std::size_t small_allreduce_bytes_;
  std::size_t direct_allreduce_bytes_;
  std::size_t shared_allreduce_bytes_;
  // Placement state is read by algorithm() from any thread while collectives run on another
  // (the nonblocking collectives' worker): set once (call_once), agreed once (atomic, -1 until).
  mutable std::once_flag placement_once_;
  mutable int local_placement_ = 0;
  mutable PeerMemories peer_memories_;
  mutable SharedAreas shared_areas_;
  std::atomic<int> agreed_placement_{-1};
  std::uint64_t shared_calls_ = 0;       // numbers the shared-memory calls (shared.hpp)
  std::size_t chunk_bytes_;              // ANVIEW_COLL_CHUNK
  std::vector<p2p::RequestPtr> posted_;  // the current call's requests
  std::vector<char> scratch_;            // the current call's incoming data
};

}  // namespace anview::collectives
