// One same-host peer of the shm transport: the ring we write to (in the peer's segment), the
// ring we read from (in ours), the frames waiting for ring space, and the payloads the peer
// reads straight from our memory (cross-memory attach) until it acknowledges them.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "base/process_watch.hpp"
#include "transport/shm/handshake.hpp"
#include "transport/transport.hpp"

namespace anview::transport::shm {

class ShmTransport;

class Connection {
 public:
  enum class State { connecting, up, closed };

  Connection(ShmTransport& owner, int peer, const Endpoint& endpoint);
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  int peer() const { return peer_; }
  State state() const { return state_; }
  const Endpoint& endpoint() const { return endpoint_; }
  bool reads_by_reference() const { return reads_by_reference_; }
  bool peer_reads_by_reference() const { return peer_reads_by_reference_; }
  const std::string& single_copy_note() const { return single_copy_note_; }
  // The peer's shared area, mapped read-only (area_bytes).
  const char* peer_area() const { return peer_area_.data(); }

  // Maps both rings and initialises ours. False (with the reason) when it cannot.
  bool attach(int own_segment_fd, std::size_t own_ring_bytes, bool try_single_copy,
              std::string* why);
  // Connecting: becomes up once the peer initialised the ring we write to. False while not.
  bool check_up(std::string* why);

  void send(const FrameHeader& header, const void* payload, Ordering ordering, SendDone done);
  // Copies a frame that fits one record into the ring if nothing is queued and there is room.
  bool try_send_now(const FrameHeader& header, const void* payload);
  // Writes queued acks and frames into the ring as far as it has room. True on progress.
  bool flush();
  // Hands the records the peer published to the sink. True on progress.
  bool receive(bool may_defer);
  void resume() { paused_.store(false, std::memory_order_relaxed); }
  // Queues a goodbye record behind everything else.
  void say_goodbye();
  bool settled() const {
    return sendq_.empty() && controls_.empty() && awaiting_ack_.empty() && splits_.empty() &&
           !goodbye_queued_;
  }
  bool goodbye_received() const { return goodbye_received_; }

  // Completes every waiting send with `error` and stops using the link; the peer learns that
  // we closed, and why (error.context().peer when it names another rank).
  void close(const Error& error);
  // The peer closed its end (after a failure of its own, or leaving) and everything it wrote
  // before has been read: the Error to fail the link with, naming the rank it lost if any.
  std::optional<Error> peer_closed_error() const;
  // Whether the peer closed its end (its flag alone: the poller asks at every round).
  bool peer_closed() const {
    return in_control_ != nullptr &&
           in_control_->producer_closed.load(std::memory_order_acquire) != 0;
  }
  // Nothing left to read in the ring (whether or not reading is paused).
  bool drained() const { return !in_.has_data(); }

  // For ShmTransport::before_sleep, which runs without the owner's lock: true when there is
  // something to do at once (records to read, or ring space for queued sends).
  bool work_pending() const { return work_pending(true); }
  // Whether the transport's poller has anything to do, for a spinning waiter: work_pending(),
  // or still connecting. It looks for the next record's flag only, not at `head`: a waiter
  // that read `head` on every spin would pull that line from the producer each message, and
  // the producer's seq_cst store of it would wait for the line to come back.
  bool state_hint_work() const {
    return connecting_.load(std::memory_order_relaxed) || work_pending(false);
  }
  // Tells the peer there is work for it, if it sleeps.
  void wake_peer();

  std::unique_ptr<base::ProcessWatch> exit_watch;

 private:
  bool work_pending(bool read_head) const;
  struct Pending {
    FrameHeader header;
    const char* payload;
    std::size_t sent = 0;  // payload bytes written so far
    bool started = false;  // the frame record is written
    bool by_reference = false;
    bool any_order = false;
    SendDone done;
  };
  // A payload the peer reads from our memory (frame_ref) until it acknowledges it.
  struct Offered {
    SendDone done;
    const char* payload;
    std::size_t bytes;
  };
  // A frame_ref whose copy we split with the producer: our part is read, its part is pushed.
  struct Split {
    FrameHeader header;
    void* landing;
  };
  // Records we owe the peer, written before any frame: acks, push requests, pushed notes.
  struct Control {
    RecordKind kind;
    PushRequest push;  // push; for ack and pushed only the cookie
  };
  bool write_frame(Pending& p);
  bool handle(const RingReader::Record& record, bool may_defer, bool& consumed);
  bool read_by_reference(void* to, std::uint64_t from, std::size_t bytes);
  bool write_by_reference(std::uint64_t to, const char* from, std::size_t bytes);
  // process_vm_writev (to_peer) or process_vm_readv of `bytes`; fails the link on error.
  bool copy_by_reference(bool to_peer, char* local, std::uint64_t remote, std::size_t bytes);
  bool handle_frame_ref(const FrameHeader& h, const PayloadRef& ref, const Landing& landing);
  bool handle_push(const PushRequest& push);
  void deliver_done(const FrameHeader& header, void* data);
  void corrupt(const std::string& what);
  void update_blocked();
  // Withdraws the memory we offered the peer (send buffers, split landings) and waits until it
  // is no longer inside one of them.
  void revoke_offers(int cause_rank);
  bool peer_gone() const;

  ShmTransport& owner_;
  const int peer_;
  const Endpoint endpoint_;
  State state_ = State::connecting;

  Mapping peer_control_page_;  // the peer's SegmentControl (its sleeping flag)
  Mapping out_slot_;           // our ring in the peer's segment
  Mapping in_slot_;            // the peer's ring in our segment
  Mapping peer_area_;          // the peer's shared area (read-only)
  SegmentControl* peer_control_ = nullptr;
  RingControl* out_control_ = nullptr;
  RingControl* in_control_ = nullptr;
  RingWriter out_;
  RingReader in_;
  sockaddr_un peer_wake_{};
  socklen_t peer_wake_len_ = 0;

  bool reads_by_reference_ = false;       // we read the peer's memory with CMA
  bool peer_reads_by_reference_ = false;  // the peer reads ours
  std::string single_copy_note_;          // why single copy is off, when it is

  std::deque<Pending> sendq_;
  std::deque<Control> controls_;
  bool goodbye_queued_ = false;
  std::unordered_map<std::uint64_t, Offered> awaiting_ack_;
  std::unordered_map<std::uint64_t, Split> splits_;
  std::uint64_t next_cookie_ = 1;

  // The frame whose payload arrives in fragments.
  bool assembling_ = false;
  FrameHeader current_{};
  Landing landing_{};
  std::size_t received_ = 0;
  bool goodbye_received_ = false;

  // Read without the owner's lock by before_sleep (see work_pending()).
  std::atomic<bool> connecting_{true};
  std::atomic<bool> paused_{false};
  std::atomic<bool> readable_{false};  // up and not closed
  std::atomic<bool> blocked_{false};   // records wait for ring space
  std::atomic<std::uint64_t> blocked_at_tail_{0};
};

}  // namespace anview::transport::shm
