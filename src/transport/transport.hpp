// The transport contract (see ../shared/ARCHITECTURE.md, "Contracts").
//
// A transport moves frames (transport/frame.hpp) between this rank and its peers. It never
// blocks: post_send queues and returns, connections are set up by the progress engine. Incoming
// frames are handed to the FrameSink (the p2p layer) in two steps, so a payload can land
// straight in its final buffer: on_frame() says where the payload goes, on_frame_done() says it
// is there.
//
// Threading: every method is called with the owner's lock held, from one thread at a time;
// sink callbacks run inside ProgressEngine::poll() (or inside post_send for in-process
// transports) under that same lock.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "anview/error.hpp"
#include "base/clock.hpp"
#include "base/metrics.hpp"
#include "base/progress_engine.hpp"
#include "transport/frame.hpp"

namespace anview::transport {

// What a peer published at bootstrap.
struct PeerInfo {
  int rank = -1;
  std::string host_id;                     // same host id: same machine
  int pid = 0;                             // its process id (watched when on the same host)
  std::vector<std::string> tcp_addresses;  // "ip:port", in the peer's preference order
  // What other transports need to reach the peer, by transport name (the shm segment, ...);
  // opaque to everyone but that transport, which checks it before use.
  std::map<std::string, std::string> endpoints;
};

struct Capabilities {
  bool zero_copy_receive = false;  // payloads land in the posted buffer without a bounce copy
  bool one_sided = false;          // native put/get on registered memory
  int streams = 1;                 // parallel connections used per peer
  bool fd_driven = false;          // traffic arrives on file descriptors: a spinning waiter
                                   // must check epoll on every round, not now and then
  double latency_us = 0;           // small-message one-way estimate, for the tuner
  double bandwidth_gbs = 0;        // large-message estimate, for the tuner
};

// Frames that must keep their order relative to each other (matching frames) go `ordered`;
// bulk data frames that carry their own offset may take any stream.
enum class Ordering { ordered, any_stream };

// Where the payload of an incoming frame goes.
struct Landing {
  void* data = nullptr;  // payload_bytes of room; may be null when payload_bytes is 0
  bool defer = false;    // no room now: stop reading from this peer until resume(peer)
};

class FrameSink {
 public:
  virtual ~FrameSink() = default;
  // may_defer is false when the transport must take the frame now (its peer closed or died
  // and the socket is being drained): the sink then buffers it past its budget.
  virtual Landing on_frame(int peer, const FrameHeader& header, bool may_defer) = 0;
  virtual void on_frame_done(int peer, const FrameHeader& header, void* data) = 0;
  // The link to `peer` failed (peer_lost, link or protocol Error). Called once per peer; after
  // it, sends to that peer complete at once with the same error.
  // `left`: the peer closed its communicator (said goodbye) after its last call, rather than
  // dying or breaking the link; a collective that no longer needs it may go on.
  virtual void on_peer_failed(int peer, const Error& error, bool left) = 0;
};

// Called once per posted frame: null when the frame (and its payload) was handed over, so the
// buffer may be reused; else why it could not be.
using SendDone = std::function<void(const Error* error)>;

struct TransportContext {
  int rank = 0;
  int world_size = 1;
  std::uint64_t job_id = 0;
  std::string host_id;                   // this host's id (bootstrap::host_id())
  std::chrono::milliseconds timeout{0};  // deadline of connection setup steps
  base::ProgressEngine* engine = nullptr;
  FrameSink* sink = nullptr;
};

// What a transport finds on this machine before any communicator exists (anview-info). Each
// transport has a static probe() returning one.
struct TransportProbe {
  std::string name;
  bool selected = false;           // ANVIEW_TRANSPORTS names it
  bool usable = false;             // this machine lets it run
  std::string detail;              // what it would use, or why it cannot run
  std::vector<std::string> notes;  // further findings (single copy, ptrace restrictions)
};

// Direct access to a peer's memory (same host, cross-memory attach): what same-host
// collectives use to reduce straight from their peers' buffers and write the result into them
// (only while the peer is inside the same call: collectives/direct.hpp), and what one-sided
// put/get use on regions the peer registered for them (after checking the registration).
//
// Threading: unlike the rest of the transport, read() is called without the owner's lock, from
// any thread, at any time while the transport exists.
class PeerMemory {
 public:
  virtual ~PeerMemory() = default;
  // Copies `bytes` at address `remote` of the peer into `local`. Raises Error naming this rank,
  // the peer and `operation`: peer_lost when its process is gone, protocol when the address is
  // not valid there, link otherwise.
  virtual void read(std::uint64_t remote, void* local, std::size_t bytes,
                    const std::string& operation) const = 0;
  // Copies `bytes` from `local` to address `remote` of the peer; raises like read().
  virtual void write(std::uint64_t remote, const void* local, std::size_t bytes,
                     const std::string& operation) const = 0;
  // Maps `bytes` of the peer's file descriptor `fd` (shared memory it allocated) read-write
  // here; null with `why` set where that is not possible.
  virtual std::shared_ptr<char> map(int fd, std::size_t bytes, std::string* why) const = 0;
};

// Native one-sided access to registered memory (RDMA through UCX: ucp_put_nbx/ucp_get_nbx on
// memory registered with ucp_mem_map), for the peers Transport::remote_access() offers it for.
// The p2p layer owns the protocol around it (one_sided_native.cpp): the owner exposes a region
// when a peer first asks for its key, hands out the packed key, and before concealing it again
// has every holder drop the key and flush what it issued with it.
//
// Threading: like the rest of the transport (the owner's lock; callbacks inside poll()).
class RemoteAccess {
 public:
  virtual ~RemoteAccess() = default;
  // Owner: makes [data, data + bytes) reachable under `token`; returns the packed key peers
  // unpack, or nullopt with `why` (the memory cannot be registered).
  virtual std::optional<std::string> expose(std::uint64_t token, void* data, std::size_t bytes,
                                            std::string* why) = 0;
  // Owner: the region is no longer reachable (its registration is released).
  virtual void conceal(std::uint64_t token) = 0;
  // Initiator: takes `peer`'s packed key of region `token`; false with `why` if unusable.
  virtual bool accept_key(int peer, std::uint64_t token, const std::string& packed,
                          std::string* why) = 0;
  virtual void forget_key(int peer, std::uint64_t token) = 0;
  // Initiator: `bytes` between `local` and address `remote` in `peer`'s region `token` (a key
  // accepted before). `done` as for post_send: a put's buffer may be reused, a get's bytes are
  // in place.
  virtual void put(int peer, std::uint64_t token, const void* local, std::size_t bytes,
                   std::uint64_t remote, SendDone done) = 0;
  virtual void get(int peer, std::uint64_t token, void* local, std::size_t bytes,
                   std::uint64_t remote, SendDone done) = 0;
  // Completes when every put and get issued to `peer` before it is complete at the target.
  virtual void flush(int peer, SendDone done) = 0;
};

// Memory of this rank that its same-host peers map (shared memory): only this rank writes
// it, peers read it at any time. The collectives layer publishes small contributions there
// and synchronises through flags in it, with no message at all.
struct SharedArea {
  char* data = nullptr;
  std::size_t bytes = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual std::string_view name() const = 0;
  virtual Capabilities capabilities() const = 0;
  // Published for every peer through the store (merged into PeerInfo).
  virtual void describe_self(PeerInfo& self) const = 0;
  // True when this transport can carry traffic to `peer`; `why` says why not.
  virtual bool can_reach(const PeerInfo& peer, std::string* why) const = 0;
  // Starts connecting to `peers` (all served by this transport) and returns at once; progress
  // completes the connections. ready() tells when every one is up.
  virtual void connect(const std::vector<PeerInfo>& peers) = 0;
  // True when every link came up (a link that came up and closed since counts as up) or failed
  // while coming up; setup_failure() then tells the first such failure.
  virtual bool ready() const = 0;
  virtual std::optional<Error> setup_failure() const = 0;
  // For error messages while not ready: which peers are still missing.
  virtual std::string pending_connections() const = 0;

  virtual void post_send(int peer, const FrameHeader& header, const void* payload,
                         Ordering ordering, SendDone done) = 0;
  // The fast path for small frames: hands the frame over at once, copied (the payload may be
  // reused on return), and returns true; or returns false having sent nothing (the frame
  // would have to wait: post_send it instead). Never reorders with frames queued before.
  virtual bool try_send_now(int /*peer*/, const FrameHeader& /*header*/, const void* /*payload*/) {
    return false;
  }
  // Reading from `peer` may go on after a deferred Landing.
  virtual void resume(int peer) = 0;
  // Closes the link to `peer` with `error` (the upper layer cannot go on with it).
  virtual void fail_peer(int peer, const Error& error) = 0;
  // Flushes queued sends (up to the deadline), tells peers this rank is leaving, closes.
  virtual void shutdown(base::Deadline deadline) = 0;
  // "127.0.0.1:4242 <-> 127.0.0.1:4711, 4 streams".
  virtual std::string describe_peer(int peer) const = 0;
  // Per-path metrics of the links it serves (metrics.hpp), each with `labels` (rank,
  // communicator) and its own; called with the owner's lock held, like the rest. Transports
  // with no paths of their own (shm, self) report nothing beyond the messenger's counters.
  virtual void collect_metrics(base::metrics::Sink& /*sink*/,
                               const base::metrics::Labels& /*labels*/) const {}
  // One-sided reads of `peer`'s memory, if this transport offers them for that peer; the object
  // lives as long as the transport.
  virtual const PeerMemory* peer_memory(int /*peer*/) const { return nullptr; }
  // True when large payloads to `peer` (connected) should go in one frame each (up to
  // ANVIEW_MAX_FRAME), not in ANVIEW_RNDV_CHUNK pieces: the transport pipelines a large
  // transfer to it itself.
  virtual bool whole_payloads(int /*peer*/) const { return false; }
  // Native one-sided access to `peer`'s registered memory, if this transport offers it for
  // that peer (null: the p2p layer emulates put and get with frames).
  virtual RemoteAccess* remote_access(int /*peer*/) { return nullptr; }
  // This rank's shared area (empty if the transport has none), and `peer`'s as mapped here
  // (read-only, the same size; null when the transport has none for that peer).
  virtual SharedArea own_area() { return {}; }
  virtual const char* peer_area(int /*peer*/) const { return nullptr; }
};

}  // namespace anview::transport
