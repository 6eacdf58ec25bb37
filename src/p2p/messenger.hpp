// The p2p engine of one communicator: tag matching, the eager and rendezvous protocols,
// requests, and the driving of progress (spin, then sleep).
//
// Locking: one mutex guards all protocol state and the transports. Progress is driven by at
// most one thread at a time (the "driver", whichever thread waits); it sleeps in epoll without
// the mutex, so other threads can post operations meanwhile. Completion callbacks run after
// the mutex is released, on the thread that completed them.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "anview/memory.hpp"
#include "base/metrics.hpp"
#include "base/progress_engine.hpp"
#include "base/shared_segment.hpp"
#include "base/trace.hpp"
#include "p2p/matching.hpp"
#include "p2p/protocol.hpp"
#include "p2p/regions.hpp"
#include "p2p/request_impl.hpp"
#include "transport/transport.hpp"

namespace anview::p2p {

using detail::RequestImpl;

struct MessengerConfig {
  int rank = 0;
  int world_size = 1;
  std::uint64_t job_id = 0;
  std::string host_id;
  std::chrono::milliseconds timeout{0};
  std::string name = "anview";  // the communicator, in metrics labels (its store prefix)
  // Registering memory starts a thread that serves peers' emulated puts and gets while no
  // thread waits (one_sided.cpp); off only where the caller drives all progress itself.
  bool background_progress = true;
};

// Requests completed in one lock round, taken out under the lock so their callbacks can run
// (and the last references drop) after it is released. Most rounds complete one or two
// requests: those are held inline, without allocating.
class Completions {
 public:
  void add(RequestPtr request, Request::Callback callback);  // a callback to run
  void add(RequestPtr request);                              // a reference to drop
  void run();                                                // the callbacks, in completion order
  bool notify = false;  // threads sleep on the messenger's condition variable

 private:
  static constexpr std::size_t inline_count = 4;
  std::array<RequestPtr, inline_count> held_;
  std::size_t count_ = 0;
  std::vector<RequestPtr> more_;
  std::vector<std::pair<RequestPtr, Request::Callback>> callbacks_;
};

class Messenger final : public transport::FrameSink,
                        public std::enable_shared_from_this<Messenger> {
 public:
  explicit Messenger(const MessengerConfig& config);
  ~Messenger() override;

  int rank() const { return config_.rank; }
  int size() const { return config_.world_size; }
  const std::string& host_id() const { return config_.host_id; }
  const std::string& name() const { return config_.name; }
  // Messages above this size go by rendezvous (ANVIEW_EAGER_BYTES, capped by the frame size).
  std::size_t eager_bytes() const { return eager_bytes_; }
  std::chrono::milliseconds default_timeout() const { return config_.timeout; }

  // Bootstrap: what this rank publishes, then connecting to everyone (blocks until every link
  // is up; raises the first link's Error, or a timeout naming the missing peers).
  transport::PeerInfo self_info() const;
  void connect(const std::vector<transport::PeerInfo>& peers);

  // Who posts a request and how it is waited for.
  enum class Poster : std::uint8_t {
    user,      // handed out as an anview::Request, which calls back through its owner
    blocking,  // a blocking call that waits for it before returning: no owner reference (two
               // atomic operations less per message)
    internal,  // a layer above p2p (collectives): may use reserved tags
  };
  RequestPtr isend(const void* data, std::size_t bytes, int peer, Tag tag,
                   Poster poster = Poster::user);
  // The blocking send's fast path: true when a small message was handed to the transport at
  // once (no request needed); false when the caller must isend() (which also reports errors).
  bool send_now(const void* data, std::size_t bytes, int peer, Tag tag);
  RequestPtr irecv(void* data, std::size_t capacity, int source, Tag tag,
                   Poster poster = Poster::user);

  // A request that a layer above completes (finish_external), e.g. a nonblocking collective
  // run by a worker thread; `operation` ("allreduce #3") names it in errors and waits.
  RequestPtr external_request(std::string operation);
  // Completes it (once) with `bytes` in its status, or with `error`; wakes its waiters.
  void finish_external(const RequestPtr& request, std::optional<Error> error, std::size_t bytes);

  bool test(RequestImpl& request);
  // Raises Error(timeout) at the deadline (the request stays pending), or the request's Error.
  Status wait(RequestImpl& request, std::chrono::milliseconds timeout);
  bool cancel(const RequestPtr& request);
  // Gives up on a request a blocking call timed out on: cancels it if it has not started,
  // else closes the link to its peer with `error` (its buffer would still be in use). False
  // when it completed in the meantime (another thread drove it home after the deadline): its
  // own outcome stands.
  bool abandon(const RequestPtr& request, const Error& error);
  void on_complete(RequestImpl& request, Request::Callback callback);
  // Registers the callback only if the request is still pending; false when it is complete
  // (`callback` is then left as it was).
  bool on_complete_if_pending(RequestImpl& request, Request::Callback&& callback);
  void progress();

  // Flushes, says goodbye, closes; pending requests fail with "communicator closed".
  void shutdown();

  // The failure of the lowest-numbered rank whose link failed, if any (collectives use it to
  // give up on a call any rank of which is gone, whoever they were waiting for). A peer that
  // closed its communicator cleanly (goodbye) is skipped: it had finished its calls, so it
  // blocks nobody; a step waiting for it fails with its request.
  std::optional<Error> first_peer_failure() const;
  // The failure of `peer`'s link, if it failed (or was closed by the peer).
  std::optional<Error> peer_failure(int peer) const;
  // What a pending request waits for, in words (as in its timeout Error).
  std::string describe_request(const RequestImpl& request) const;
  // The pending point-to-point requests (receives waiting for a match, rendezvous transfers),
  // at most `limit` of them, and the unexpected messages held, for the flight recorder's dumps.
  struct PendingRequest {
    const char* kind;  // "recv", "send"
    int peer;          // any_source for a wildcard receive
    std::uint64_t tag;
    std::size_t bytes;  // capacity of a receive, size of a send
    const char* phase;  // "posted", "matched", "transferring"
    bool internal;      // a collective's (reserved tag)
  };
  struct PendingSummary {
    std::vector<PendingRequest> requests;
    std::size_t unexpected_messages = 0;
    std::size_t unexpected_bytes = 0;
  };
  PendingSummary pending(std::size_t limit) const;

  // One-sided reads of `peer`'s memory, when its transport offers them and its link is up
  // (null otherwise, and for this rank itself). The object outlives every communicator call.
  const transport::PeerMemory* peer_memory(int peer) const;
  // This rank's shared area and `peer`'s as mapped here (transport.hpp, SharedArea); empty or
  // null where the transports have none. Both outlive every communicator call.
  transport::SharedArea own_area() const;
  const char* peer_area(int peer) const;

  // One-sided access (one_sided.cpp, docs/one-sided.md). Registering starts the background
  // progress that serves peers' emulated puts and gets while no thread of this rank waits.
  RemoteKey register_memory(void* data, std::size_t bytes);
  RemoteKey allocate_memory(std::size_t bytes);
  void deregister_memory(std::uint64_t token);
  RequestPtr put(const void* local, std::size_t bytes, const RemoteKey& key, std::uint64_t offset);
  RequestPtr get(void* local, std::size_t bytes, const RemoteKey& key, std::uint64_t offset);
  RequestPtr flush(int peer);  // any_source: every peer

  // Called (on the waiting thread, without locks) with the report each time a blocking wait
  // on a point-to-point request has gone another ANVIEW_WATCHDOG interval; set before use.
  void set_stall_hook(std::function<void(const std::string&)> hook) {
    stall_hook_ = std::move(hook);
  }

  std::string transport_name(int peer) const;
  std::string describe_peer(int peer) const;
  // Why the registry chose that transport (or why none reaches the peer).
  std::string transport_reason(int peer) const;

  // transport::FrameSink (called with mu_ held)
  transport::Landing on_frame(int peer, const transport::FrameHeader& header,
                              bool may_defer) override;
  void on_frame_done(int peer, const transport::FrameHeader& header, void* data) override;
  void on_peer_failed(int peer, const Error& error, bool left) override;

 private:
  // A flush: complete when no operation below `before` is left at any of its peers.
  struct Flush {
    RequestPtr request;
    std::uint64_t before = 0;
    int peers_left = 0;
    std::optional<Error> error;  // the first failure among the operations it covers
  };
  struct PeerState {
    transport::Transport* transport = nullptr;
    std::string transport_reason;
    std::size_t chunk_bytes = 0;  // rendezvous and one-sided payloads go in frames of this size
    std::optional<Error> failure;
    bool left = false;  // the failure is the peer's goodbye after its last call
    std::size_t unexpected_bytes = 0;
    bool deferred = false;
    RequestPtr eager_target;                     // receive the current eager frame lands in
    UnexpectedQueue::Iterator eager_unexpected;  // or the unexpected entry it fills
    bool eager_to_unexpected = false;
    // One-sided operations to this peer in flight (emulated with frames), by id, and the
    // flushes waiting for them.
    std::map<std::uint64_t, RequestPtr> rma;
    std::vector<std::shared_ptr<Flush>> flushes;
    std::optional<Error> rma_failure;  // an operation's failure no flush has reported yet
    GetRequest incoming_get;           // the payload of the get frame arriving from this peer
    // Native one-sided access to this peer's regions (one_sided_native.cpp): their keys as
    // learnt here, by token; whether native operations were issued since the last flush; the
    // payload of the key_reply arriving.
    struct NativeKey {
      bool ready = false;  // false: asked for, the reply is still to come
      // That accepted the key; null once ready: frames instead (the owner could not expose
      // the region natively, or the key was not usable here).
      transport::RemoteAccess* access = nullptr;
      std::uint64_t address = 0, bytes = 0;  // the region, as the owner registered it
      struct Waiting {
        RequestPtr op;
        RemoteKey key;
        std::uint64_t offset = 0;
      };
      std::vector<Waiting> waiting;  // operations that came before the reply
    };
    std::unordered_map<std::uint64_t, NativeKey> native_keys;
    bool native_unflushed = false;
    std::vector<char> incoming_key;
    // Metrics (metrics.hpp), counted under mu_.
    struct Stats {
      std::uint64_t sent_messages = 0, sent_bytes = 0;
      std::uint64_t received_messages = 0, received_bytes = 0;
      std::uint64_t errors = 0;
      std::uint64_t native_rma = 0;  // puts and gets through the transport's native path
      base::metrics::Histogram send_latency, recv_latency;  // rendezvous-sized requests
    } stats;
  };
  using Lock = std::unique_lock<std::mutex>;

  // All below: mu_ held.
  void complete(RequestImpl& request, std::optional<Error> error, RequestPtr ref);
  void complete(RequestPtr request, std::optional<Error> error);
  void take_completed(Completions& out);
  // Without mu_: wakes sleeping waiters if needed, runs the callbacks.
  void run_callbacks(Completions& completed);
  // mu_ held, completed_ not empty: takes the completions out, releases `lock` and runs them.
  // Out of line so that the hot rounds (isend, irecv, drive), which mostly complete nothing or
  // blocking calls only, do not build a Completions: GCC zero-fills its 136 bytes with
  // `rep stos` at every call, which was 12% of a spinning waiter's cycles over UCX.
  [[gnu::noinline]] void run_completed(Lock& lock);
  void match_unexpected(const RequestPtr& recv, UnexpectedQueue::Iterator it);
  void start_rendezvous_receive(const RequestPtr& recv, int source, std::uint64_t tag,
                                std::size_t bytes, std::uint64_t sender_id);
  void send_data(const RequestPtr& send, std::uint64_t receiver_id);
  void send_frame(int peer, const transport::FrameHeader& header, const void* payload,
                  transport::Ordering ordering, transport::SendDone done);
  void protocol_error(int peer, const std::string& cause);
  // One-sided (one_sided.cpp), mu_ held.
  transport::Landing on_rma_frame(int peer, const transport::FrameHeader& header);
  void on_rma_frame_done(int peer, const transport::FrameHeader& header);
  void finish_rma(int peer, std::uint64_t id, std::optional<Error> error);
  // Completes `op`, or for a put whose chunks the transport still holds, keeps the outcome
  // until the last chunk is let go (complete_answered()).
  void hold_or_complete(const RequestPtr& op, std::optional<Error> outcome);
  void complete_answered(const RequestPtr& op);
  void settle_flushes(PeerState& ps);
  void fail_rma(PeerState& ps, const Error& error);
  void reject_rma(int peer, FrameType type, std::uint64_t id, RmaReject why);
  RequestPtr start_rma(RequestImpl::Kind kind, const RemoteKey& key, std::size_t bytes,
                       std::uint64_t offset);
  RequestPtr issue_rma(const RequestPtr& op, const RemoteKey& key, std::uint64_t offset);
  void emulate_rma(const RequestPtr& op, const RemoteKey& key, std::uint64_t offset);
  // Puts and gets to this rank itself, and through a transport's direct access (no lock held).
  std::optional<Error> local_rma(RequestImpl& op, const RemoteKey& key, std::uint64_t offset);
  std::optional<Error> direct_rma(RequestImpl& op, const transport::PeerMemory& memory,
                                  const RemoteKey& key, std::uint64_t offset);
  std::optional<Error> mapped_rma(RequestImpl& op, char* segment, const RemoteKey& key,
                                  std::uint64_t offset);
  Error rma_error(const RequestImpl& op, ErrorKind kind, std::string cause) const;
  static const char* rma_name(RequestImpl::Kind kind);  // "put", "get", "flush"
  static std::string stale_cause(int owner);            // a key whose region is gone
  // Native one-sided access (one_sided_native.cpp), mu_ held.
  void native_rma(const RequestPtr& op, const RemoteKey& key, std::uint64_t offset);
  void post_native(const RequestPtr& op, const RemoteKey& key, std::uint64_t offset,
                   const PeerState::NativeKey& native, bool then_flush);
  transport::Landing on_key_frame(int peer, const transport::FrameHeader& header);
  void on_key_frame_done(int peer, const transport::FrameHeader& header);
  void answer_key_request(int peer, std::uint64_t token);
  void take_key_reply(int peer, const transport::FrameHeader& header);
  void refuse_waiting(int peer, std::uint64_t token, RmaReject why);
  void drop_key(int peer, std::uint64_t token);
  void key_released(std::uint64_t token, int peer);
  // Peers that issued native flushes since the last flush get a transport flush each, as an
  // operation of theirs the flush `before` waits for.
  void flush_native(int peer);
  // Deregistration of an exposed region: every holder drops its key and flushes first. Waits
  // (up to the timeout) without mu_; then releases the registration.
  void withdraw_native(std::uint64_t token);
  RemoteKey add_region(void* data, std::size_t bytes, std::unique_ptr<base::SharedSegment> segment);
  // The peer's allocated region of `key` mapped here (cached), or null where it cannot be.
  std::shared_ptr<char> mapping(const transport::PeerMemory& memory, const RemoteKey& key);
  // The thread that drives progress while nobody waits, so peers' emulated one-sided
  // operations are served (started by the first registration; stopped by shutdown()).
  void start_background_progress();
  void stop_background_progress();
  void background_progress();
  // A thread that wants the driver role while the background thread sleeps with it.
  void kick_background();
  void release_unexpected(int peer, std::size_t bytes);
  // Reading from `peer` paused on a frame over the unexpected budget: try that frame again.
  void resume_reading(int peer);
  Error request_error(const RequestImpl& request, ErrorKind kind, std::string cause) const;
  std::string describe_wait(const RequestImpl& request) const;
  bool all_remote_peers_failed() const;
  bool take_driver_role();
  void release_driver_role();  // wakes threads sleeping on cv_
  // shutdown()'s way to the role: it asks the thread that holds it to give it up (closing_),
  // wakes it from its sleep in epoll, and waits for it up to `deadline`. False (logged) if the
  // role stayed taken.
  bool take_driver_role_to_close(base::Deadline deadline);
  // After completing requests on a thread that is not the driver (cancel, abandon, an
  // external request's end): wakes the driver from its sleep in epoll.
  void wake_driver();
  // One round of progress as the driver; sleeps up to sleep_ms when idle.
  // `polled`: a program's progress() or test(), not a waiter's spin.
  void drive(int sleep_ms, bool polled = false);

  MessengerConfig config_;
  mutable std::mutex mu_;
  std::condition_variable cv_;             // signalled when requests complete or the driver leaves
  std::atomic<bool> driving_{false};       // a thread drives progress (lock-free role)
  std::atomic<std::thread::id> driver_{};  // the thread that holds the role
  std::atomic<int> closing_{0};            // shutdown()s that want the role: no one else takes it
  bool pollers_busy_ = true;               // the driver's: pollers had work on the last round
  unsigned rounds_to_fd_check_ = 1;        // the driver's: rounds until epoll is polled again
  unsigned fd_check_every_ = 1;            // such rounds poll epoll once per this many
  base::Clock::time_point last_fd_check_{};  // the driver's: when epoll was last polled
  std::atomic<int> sleepers_{0};             // threads sleeping on cv_ (incremented under mu_)

  base::ProgressEngine engine_;
  std::unique_ptr<transport::Transport> self_;
  std::vector<std::unique_ptr<transport::Transport>> transports_;
  std::vector<PeerState> peers_;

  PostedQueue posted_;          // receives waiting for a match
  UnexpectedQueue unexpected_;  // messages that arrived before their receive
  std::unordered_map<std::uint64_t, RequestPtr> sends_;  // rendezvous sends by id
  std::unordered_map<std::uint64_t, RequestPtr> recvs_;  // rendezvous receives by id
  std::uint64_t next_id_ = 1;
  RegionTable regions_;
  // allocate_memory's segments by token, and peers' segments mapped here by (rank, token).
  std::unordered_map<std::uint64_t, std::unique_ptr<base::SharedSegment>> segments_;
  std::map<std::pair<int, std::uint64_t>, std::shared_ptr<char>> mappings_;
  // Regions of this rank exposed through a transport's native access, by token: the packed
  // key, and the peers holding it; and deregistrations waiting for the holders to drop it.
  struct Exposure {
    transport::RemoteAccess* access = nullptr;
    std::string packed;
    std::set<int> holders;
  };
  std::unordered_map<std::uint64_t, Exposure> exposed_;
  struct Withdrawal {
    RequestPtr request;
    std::set<int> waiting;
  };
  std::unordered_map<std::uint64_t, Withdrawal> withdrawals_;
  std::thread background_;
  std::atomic<bool> background_stop_{false};
  std::atomic<bool> background_on_{false};
  // Threads that want the driver role the background thread may hold (it then backs off).
  std::atomic<int> role_wanted_{0};
  std::atomic<bool> role_kicked_{false};
  std::atomic<bool> background_driving_{false};  // the background thread holds the role
  std::mutex background_mu_;
  std::condition_variable background_cv_;
  std::vector<RequestPtr> completed_;  // waiting for their callbacks to run
  bool closed_ = false;

  std::size_t eager_bytes_;
  std::size_t unexpected_limit_;
  // The frame size of rendezvous and one-sided payloads to `peer` (mu_ held).
  std::size_t chunk_bytes(int peer) const {
    return peers_[static_cast<std::size_t>(peer)].chunk_bytes;
  }
  std::chrono::microseconds spin_;
  base::Trace* trace_ = nullptr;        // ANVIEW_TRACE at the transfers level, else null
  std::chrono::milliseconds watchdog_;  // ANVIEW_WATCHDOG
  std::function<void(const std::string&)> stall_hook_;
  // The hang doctor's line for a user request waited on for `waited`: logged, then the hook.
  void report_stall(const RequestImpl& request, std::chrono::milliseconds waited);
  // Records a completed send or receive in the trace (mu_ held).
  void trace_transfer(const RequestImpl& request) const;
  // Counts a completed send or receive in its peer's stats (mu_ held).
  void count(const RequestImpl& request);
  void collect_metrics(base::metrics::Sink& sink) const;
  // Last member: unregisters first, before what its collect function reads goes away.
  base::metrics::Group metrics_;
  // wait() for an external request: yield, then sleep until the thread running it completes it.
  Status wait_external(RequestImpl& request, std::chrono::milliseconds timeout);
};

}  // namespace anview::p2p
