#include "transport/shm/connection.hpp"

#include <signal.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "base/clock.hpp"
#include "base/log.hpp"
#include "base/random.hpp"
#include "base/shared_segment.hpp"
#include "transport/cross_memory.hpp"
#include "transport/shm/shm_transport.hpp"

namespace anview::transport::shm {
namespace {

// Send callbacks collected in one flush; most flushes complete a frame or two, held inline.
class Finished {
 public:
  void add(SendDone done) {
    if (count_ < inline_.size()) {
      inline_[count_++] = std::move(done);
    } else {
      more_.push_back(std::move(done));
    }
  }
  void run() {
    for (std::size_t i = 0; i < count_; ++i) inline_[i](nullptr);
    for (auto& done : more_) done(nullptr);
  }

 private:
  std::array<SendDone, 4> inline_;
  std::size_t count_ = 0;
  std::vector<SendDone> more_;
};

}  // namespace

Connection::Connection(ShmTransport& owner, int peer, const Endpoint& endpoint)
    : owner_(owner), peer_(peer), endpoint_(endpoint) {
  peer_wake_.sun_family = AF_UNIX;
  // Abstract namespace: the name starts with a zero byte and is not NUL-terminated.
  const std::size_t n = std::min(endpoint.wake_name.size(), sizeof peer_wake_.sun_path - 1);
  std::memcpy(peer_wake_.sun_path + 1, endpoint.wake_name.data(), n);
  peer_wake_len_ = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

namespace {
std::string hex(std::uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%x", value);
  return text;
}
}  // namespace

bool Connection::attach(int own_segment_fd, std::size_t own_ring_bytes, bool try_single_copy,
                        std::string* why) {
  const int me = owner_.rank();
  // The ring we write: slot `me` of the peer's segment, plus its control page.
  const int fd = open_peer_segment(endpoint_.pid, endpoint_.segment_fd, why);
  if (fd < 0) return false;
  base::Fd peer_segment(fd);
  // Sealed against shrinking before its size is read, and as large as what is mapped of it:
  // a touch past the end of the peer's file (then, or after it shrank) would be SIGBUS.
  const auto size = base::sealed_size(fd);
  if (!size) {
    if (why) *why = "its segment's size is not sealed against shrinking (F_SEAL_SHRINK)";
    return false;
  }
  if (*size < page_bytes) {
    if (why) *why = "its segment is smaller than its control page";
    return false;
  }
  peer_control_page_ = map_shared(fd, 0, page_bytes, why);
  if (!peer_control_page_) return false;
  peer_control_ = reinterpret_cast<SegmentControl*>(peer_control_page_.data());
  // Each field read once (the peer can write them meanwhile), and the segment as large as they
  // say: a mapping past the end of the peer's file maps, and faults (SIGBUS) at first touch.
  const std::uint32_t magic = peer_control_->magic, version = peer_control_->version,
                      slots = peer_control_->slots, areas = peer_control_->area_bytes;
  const std::uint64_t ring_bytes = peer_control_->ring_bytes;
  const bool sized =
      *size >= area_offset(static_cast<int>(slots), endpoint_.ring_bytes) + area_bytes;
  if (magic != segment_magic || version != segment_version || ring_bytes != endpoint_.ring_bytes ||
      slots != static_cast<std::uint32_t>(owner_.world_size()) || areas != area_bytes || !sized) {
    if (why) {
      *why = "its segment is not an anview v" + std::to_string(segment_version) + " segment of " +
             std::to_string(owner_.world_size()) + " slots of " +
             std::to_string(endpoint_.ring_bytes) + "-byte rings (magic " + hex(magic) +
             ", version " + std::to_string(version) + ", " + std::to_string(slots) + " slots of " +
             std::to_string(ring_bytes) + " bytes, " +
             std::string(sized ? "a file large enough" : "a file too small for them") + ")";
    }
    return false;
  }
  out_slot_ =
      map_shared(fd, slot_offset(me, endpoint_.ring_bytes), slot_bytes(endpoint_.ring_bytes), why);
  if (!out_slot_) return false;
  out_control_ = reinterpret_cast<RingControl*>(out_slot_.data());
  peer_area_ = map_shared(fd, area_offset(static_cast<int>(slots), endpoint_.ring_bytes),
                          area_bytes, why, false);
  if (!peer_area_) return false;

  // The ring we read: slot `peer` of our segment. We are its consumer and initialise it.
  in_slot_ = map_shared(own_segment_fd, slot_offset(peer_, own_ring_bytes),
                        slot_bytes(own_ring_bytes), why);
  if (!in_slot_) return false;
  auto* in_control = reinterpret_cast<RingControl*>(in_slot_.data());
  if (try_single_copy) {
    reads_by_reference_ =
        probe_cross_memory_attach(endpoint_.pid, endpoint_.probe_address, &single_copy_note_);
  } else {
    single_copy_note_ = "single copy disabled by ANVIEW_SHM_CMA=0";
  }
  in_control->magic = ring_magic;
  in_control->version = ring_version;
  in_control->capacity = own_ring_bytes;
  // Random, so that no payload anyone sends holds a flag due on some ring but by chance.
  const std::uint64_t salt = base::random_u64();
  in_control->flag_salt = salt;
  in_control->consumer_flags = reads_by_reference_ ? consumer_reads_by_reference : 0;
  in_control->head.store(0, std::memory_order_relaxed);
  in_control->tail.store(0, std::memory_order_relaxed);
  in_control->producer_closed.store(0, std::memory_order_relaxed);
  in_control->consumer_accessing.store(0, std::memory_order_relaxed);
  in_control->close_cause.store(-1, std::memory_order_relaxed);
  in_control->ready.store(1, std::memory_order_release);
  in_control_ = in_control;
  in_.attach(in_control, in_slot_.data() + ring_data_offset, own_ring_bytes, salt);
  return true;
}

bool Connection::check_up(std::string* why) {
  if (state_ != State::connecting) return state_ == State::up;
  if (out_control_->ready.load(std::memory_order_acquire) == 0) return false;
  // A ring nothing went through yet starts at 0: a writer that began elsewhere would place
  // its first records by the peer's numbers (RingWriter::attach starts at 0 whatever is there).
  if (out_control_->magic != ring_magic || out_control_->version != ring_version ||
      out_control_->capacity != endpoint_.ring_bytes ||
      out_control_->head.load(std::memory_order_relaxed) != 0 ||
      out_control_->tail.load(std::memory_order_relaxed) != 0) {
    if (why) {
      *why = "the ring rank " + std::to_string(peer_) + " prepared for us has version " +
             std::to_string(out_control_->version) + ", capacity " +
             std::to_string(out_control_->capacity) + ", head " +
             std::to_string(out_control_->head.load(std::memory_order_relaxed)) + " and tail " +
             std::to_string(out_control_->tail.load(std::memory_order_relaxed)) + "; expected v" +
             std::to_string(ring_version) + ", " + std::to_string(endpoint_.ring_bytes) +
             ", 0 and 0";
    }
    return false;
  }
  peer_reads_by_reference_ = (out_control_->consumer_flags & consumer_reads_by_reference) != 0;
  out_.attach(out_control_, out_slot_.data() + ring_data_offset, endpoint_.ring_bytes);
  state_ = State::up;
  readable_.store(true, std::memory_order_relaxed);
  connecting_.store(false, std::memory_order_relaxed);
  return true;
}

void Connection::send(const FrameHeader& header, const void* payload, Ordering ordering,
                      SendDone done) {
  // Small frames take ShmTransport::try_send_now; what comes here queues behind the rest.
  Pending p{header, static_cast<const char*>(payload)};
  p.by_reference = peer_reads_by_reference_ && header.payload_bytes > owner_.single_copy_bytes();
  p.any_order = ordering == Ordering::any_stream;
  p.done = std::move(done);
  sendq_.push_back(std::move(p));
  flush();
}

bool Connection::try_send_now(const FrameHeader& header, const void* payload) {
  if (state_ != State::up || !sendq_.empty() || !controls_.empty() || goodbye_queued_) return false;
  const std::size_t bytes = header.payload_bytes;
  if (bytes > out_.max_body() - sizeof(FrameHeader) ||
      (peer_reads_by_reference_ && bytes > owner_.single_copy_bytes())) {
    return false;
  }
  char* body = out_.reserve(RecordKind::frame, sizeof(FrameHeader) + bytes);
  if (body == nullptr) return false;
  std::memcpy(body, &header, sizeof header);
  if (bytes > 0) std::memcpy(body + sizeof header, payload, bytes);
  out_.publish();
  wake_peer();
  return true;
}

bool Connection::write_frame(Pending& p) {
  const std::size_t payload = p.header.payload_bytes;
  if (!p.started) {
    if (p.by_reference) {
      char* body = out_.reserve(RecordKind::frame_ref, sizeof(FrameHeader) + sizeof(PayloadRef));
      if (body == nullptr) return false;
      const PayloadRef ref{reinterpret_cast<std::uint64_t>(p.payload), next_cookie_++,
                           p.any_order ? ref_any_order : 0};
      std::memcpy(body, &p.header, sizeof(FrameHeader));
      std::memcpy(body + sizeof(FrameHeader), &ref, sizeof ref);
      awaiting_ack_.emplace(ref.cookie, Offered{std::move(p.done), p.payload, payload});
      p.sent = payload;
      p.started = true;
      return true;
    }
    const std::size_t first = std::min(payload, out_.max_body() - sizeof(FrameHeader));
    char* body = out_.reserve(RecordKind::frame, sizeof(FrameHeader) + first);
    if (body == nullptr) return false;
    std::memcpy(body, &p.header, sizeof(FrameHeader));
    if (first > 0) std::memcpy(body + sizeof(FrameHeader), p.payload, first);
    p.sent = first;
    p.started = true;
  }
  while (p.sent < payload) {
    const std::size_t n = std::min(payload - p.sent, out_.max_body());
    char* body = out_.reserve(RecordKind::fragment, n);
    if (body == nullptr) return false;
    std::memcpy(body, p.payload + p.sent, n);
    p.sent += n;
  }
  return true;
}

bool Connection::flush() {
  if (state_ != State::up) return false;
  if (controls_.empty() && sendq_.empty() && !goodbye_queued_) {
    // The common case on every poll: nothing waits, and the consumer's cache lines stay put.
    if (blocked_.load(std::memory_order_relaxed)) blocked_.store(false, std::memory_order_relaxed);
    return false;
  }
  bool wrote = false;
  while (!controls_.empty()) {
    const Control& c = controls_.front();
    const std::size_t bytes =
        c.kind == RecordKind::push ? sizeof(PushRequest) : sizeof(std::uint64_t);
    char* body = out_.reserve(c.kind, bytes);
    if (body == nullptr) break;
    std::memcpy(body, &c.push, bytes);  // the cookie is PushRequest's first field
    controls_.pop_front();
    wrote = true;
  }
  // Frames complete (their buffers may be reused) once written; by-reference ones on their ack.
  // Their callbacks are taken out of the queue before any runs: a callback may post again.
  Finished finished;
  while (controls_.empty() && !sendq_.empty()) {
    Pending& p = sendq_.front();
    const bool started = p.started;
    const std::size_t sent = p.sent;
    const bool complete = write_frame(p);
    wrote |= p.started != started || p.sent != sent;
    if (!complete) break;
    if (!p.by_reference && p.done) finished.add(std::move(p.done));
    sendq_.pop_front();
  }
  if (controls_.empty() && sendq_.empty() && goodbye_queued_) {
    if (out_.reserve(RecordKind::goodbye, 0) != nullptr) {
      goodbye_queued_ = false;
      wrote = true;
    }
  }
  if (wrote) {
    out_.publish();
    wake_peer();
  }
  update_blocked();
  finished.run();
  return wrote;
}

void Connection::update_blocked() {
  const bool blocked = !controls_.empty() || !sendq_.empty() || goodbye_queued_;
  // The tail the failed reserve() saw, not the tail now: space the consumer freed since then
  // (its wake-up came while we were not asleep, and went unsent) must count as progress, or
  // we would sleep on a ring that has room.
  if (blocked) blocked_at_tail_.store(out_.seen_tail(), std::memory_order_relaxed);
  blocked_.store(blocked, std::memory_order_relaxed);
}

void Connection::say_goodbye() {
  goodbye_queued_ = true;
  flush();
}

void Connection::wake_peer() {
  // Pairs with ShmTransport::before_sleep: our seq_cst publish of head (or tail) is ordered
  // before this load, its seq_cst store of `sleeping` before its check of our ring.
  if (peer_control_->sleeping.load(std::memory_order_seq_cst) == 0) return;
  if (peer_control_->sleeping.exchange(0, std::memory_order_seq_cst) == 0) return;
  const char byte = 1;
  // Failure is harmless: a full socket already holds a wake-up; a dead peer is seen by pidfd.
  [[maybe_unused]] ssize_t n =
      ::sendto(owner_.wake_socket(), &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL,
               reinterpret_cast<const sockaddr*>(&peer_wake_), peer_wake_len_);
}

bool Connection::work_pending(bool read_head) const {
  if (!readable_.load(std::memory_order_relaxed)) return false;
  // Before sleeping: the peer closed its end after our poller last looked, and saw us awake
  // (no wake-up). Pairs with revoke_offers(): its seq_cst store of the flag before its load of
  // `sleeping`, our store of `sleeping` before this load.
  if (read_head && in_control_->producer_closed.load(std::memory_order_seq_cst) != 0) return true;
  if (!paused_.load(std::memory_order_relaxed) && (read_head ? in_.has_data() : in_.next_arrived()))
    return true;
  return blocked_.load(std::memory_order_relaxed) &&
         out_control_->tail.load(std::memory_order_seq_cst) !=
             blocked_at_tail_.load(std::memory_order_relaxed);
}

bool Connection::receive(bool may_defer) {
  if (state_ != State::up) return false;
  bool worked = false;
  // At most a ring's worth of records per call: a producer that keeps writing records ahead
  // of us (its numbers come from memory it can write) must not hold the progress lock forever.
  // What is left is read in the next round, which this one's work asks for.
  std::size_t budget = in_.capacity() / record_align;
  while (budget-- > 0 && state_ == State::up && !paused_.load(std::memory_order_relaxed)) {
    RingReader::Record record;
    std::string error;
    if (!in_.peek(record, error, /*announced_only=*/worked)) {
      if (!error.empty()) corrupt(error);
      break;
    }
    bool consumed = true;
    if (!handle(record, may_defer, consumed)) break;  // the link failed
    if (!consumed) break;                             // the sink deferred it
    in_.pop(record);
    worked = true;
    if (goodbye_received_) break;
  }
  if (worked && state_ == State::up) {
    in_.publish();
    wake_peer();  // it may wait for ring space
  }
  if (!controls_.empty()) flush();
  return worked;
}

bool Connection::handle(const RingReader::Record& r, bool may_defer, bool& consumed) {
  FrameHeader h;
  switch (r.kind) {
    case RecordKind::frame:
    case RecordKind::frame_ref: {
      if (assembling_) {
        corrupt("a new frame began while " + std::to_string(current_.payload_bytes - received_) +
                " bytes of the previous one were missing");
        return false;
      }
      const bool by_ref = r.kind == RecordKind::frame_ref;
      if (r.bytes < sizeof h || (by_ref && r.bytes != sizeof h + sizeof(PayloadRef))) {
        corrupt("a frame record of " + std::to_string(r.bytes) + " bytes");
        return false;
      }
      std::memcpy(&h, r.body, sizeof h);
      const std::size_t inline_bytes = by_ref ? 0 : r.bytes - sizeof h;
      if (h.reserved != 0 || h.payload_bytes > owner_.max_frame() ||
          inline_bytes > h.payload_bytes || (by_ref && !reads_by_reference_)) {
        corrupt("a frame header announcing " + std::to_string(h.payload_bytes) +
                " payload bytes (" + std::to_string(inline_bytes) + " inline" +
                (by_ref ? ", by reference" : "") + ")");
        return false;
      }
      const Landing landing = owner_.sink().on_frame(peer_, h, may_defer);
      if (state_ != State::up) return false;
      if (landing.defer) {
        paused_.store(true, std::memory_order_relaxed);
        consumed = false;
        return true;
      }
      if (by_ref) {
        PayloadRef ref;
        std::memcpy(&ref, r.body + sizeof h, sizeof ref);
        return handle_frame_ref(h, ref, landing);
      }
      if (landing.data != nullptr && inline_bytes > 0)
        std::memcpy(landing.data, r.body + sizeof h, inline_bytes);
      if (inline_bytes == h.payload_bytes) {
        deliver_done(h, landing.data);
        return state_ == State::up;
      }
      assembling_ = true;
      current_ = h;
      landing_ = landing;
      received_ = inline_bytes;
      return true;
    }
    case RecordKind::fragment: {
      if (!assembling_ || r.bytes == 0 || r.bytes > current_.payload_bytes - received_) {
        corrupt("a fragment of " + std::to_string(r.bytes) + " bytes " +
                (assembling_ ? "past the end of its frame" : "outside any frame"));
        return false;
      }
      if (landing_.data != nullptr)
        std::memcpy(static_cast<char*>(landing_.data) + received_, r.body, r.bytes);
      received_ += r.bytes;
      if (received_ == current_.payload_bytes) {
        assembling_ = false;
        deliver_done(current_, landing_.data);
        return state_ == State::up;
      }
      return true;
    }
    case RecordKind::ack: {
      std::uint64_t cookie = 0;
      if (r.bytes == sizeof cookie) std::memcpy(&cookie, r.body, sizeof cookie);
      auto it = awaiting_ack_.find(cookie);
      if (it == awaiting_ack_.end()) {
        corrupt("an acknowledgement of a payload that was never offered");
        return false;
      }
      SendDone done = std::move(it->second.done);
      awaiting_ack_.erase(it);
      if (done) done(nullptr);
      return state_ == State::up;
    }
    case RecordKind::push: {
      PushRequest push{};
      if (r.bytes != sizeof push) {
        corrupt("a push request of " + std::to_string(r.bytes) + " bytes");
        return false;
      }
      std::memcpy(&push, r.body, sizeof push);
      return handle_push(push);
    }
    case RecordKind::pushed: {
      std::uint64_t cookie = 0;
      if (r.bytes == sizeof cookie) std::memcpy(&cookie, r.body, sizeof cookie);
      auto it = splits_.find(cookie);
      if (it == splits_.end()) {
        corrupt("a pushed note for a copy that was never split");
        return false;
      }
      const Split split = it->second;
      splits_.erase(it);
      controls_.push_back(Control{RecordKind::ack, PushRequest{cookie, 0, 0, 0}});
      deliver_done(split.header, split.landing);
      return state_ == State::up;
    }
    case RecordKind::goodbye:
      if (r.bytes != 0 || assembling_) {
        corrupt("a goodbye in the middle of a frame");
        return false;
      }
      goodbye_received_ = true;
      return true;
    case RecordKind::pad:
      break;  // skipped by the reader
  }
  corrupt("an unexpected record kind");
  return false;
}

bool Connection::handle_frame_ref(const FrameHeader& h, const PayloadRef& ref,
                                  const Landing& landing) {
  const std::size_t bytes = h.payload_bytes;
  if (landing.data == nullptr) {  // nothing to copy (a dropped payload): just release it
    controls_.push_back(Control{RecordKind::ack, PushRequest{ref.cookie, 0, 0, 0}});
    return true;
  }
  // A large payload that may complete out of order is copied by both processes at once: we
  // read the first part while the producer writes the rest into our buffer. One copy of the
  // bytes, on two cores.
  const std::size_t split_min = owner_.split_bytes();
  if ((ref.flags & ref_any_order) != 0 && split_min > 0 && bytes >= split_min &&
      peer_reads_by_reference_) {
    if (splits_.count(ref.cookie) != 0) {
      corrupt("a payload offered twice under one cookie");
      return false;
    }
    const std::size_t ours = (bytes / 2) & ~(page_bytes - 1);
    auto* landing_bytes = static_cast<char*>(landing.data);
    controls_.push_back(
        Control{RecordKind::push,
                PushRequest{ref.cookie, reinterpret_cast<std::uint64_t>(landing_bytes + ours), ours,
                            bytes - ours}});
    flush();  // publish the request before we copy, so the producer copies meanwhile
    if (state_ != State::up || !read_by_reference(landing.data, ref.address, ours)) return false;
    splits_.emplace(ref.cookie, Split{h, landing.data});
    return true;
  }
  if (!read_by_reference(landing.data, ref.address, bytes)) return false;
  controls_.push_back(Control{RecordKind::ack, PushRequest{ref.cookie, 0, 0, 0}});
  deliver_done(h, landing.data);
  return state_ == State::up;
}

bool Connection::handle_push(const PushRequest& push) {
  auto it = awaiting_ack_.find(push.cookie);
  if (it == awaiting_ack_.end() || push.bytes == 0 || push.offset > it->second.bytes ||
      push.bytes > it->second.bytes - push.offset) {
    corrupt("a push request outside any offered payload (offset " + std::to_string(push.offset) +
            ", " + std::to_string(push.bytes) + " bytes)");
    return false;
  }
  if (!write_by_reference(push.destination, it->second.payload + push.offset, push.bytes))
    return false;
  controls_.push_back(Control{RecordKind::pushed, PushRequest{push.cookie, 0, 0, 0}});
  return true;
}

void Connection::deliver_done(const FrameHeader& header, void* data) {
  if (data != nullptr || header.payload_bytes == 0)
    owner_.sink().on_frame_done(peer_, header, data);
}

bool Connection::read_by_reference(void* to, std::uint64_t from, std::size_t bytes) {
  return copy_by_reference(false, static_cast<char*>(to), from, bytes);
}

bool Connection::write_by_reference(std::uint64_t to, const char* from, std::size_t bytes) {
  return copy_by_reference(true, const_cast<char*>(from), to, bytes);
}

bool Connection::copy_by_reference(bool to_peer, char* local, std::uint64_t remote,
                                   std::size_t bytes) {
  // The peer may withdraw what it offered (it closed the link): announce the access, then
  // check, so a closing peer either sees us and waits, or we see it and stay out.
  in_control_->consumer_accessing.fetch_add(1, std::memory_order_seq_cst);
  struct Leave {
    RingControl* control;
    ~Leave() { control->consumer_accessing.fetch_sub(1, std::memory_order_release); }
  } leave{in_control_};
  if (in_control_->producer_closed.load(std::memory_order_seq_cst) != 0) {
    owner_.fail_link(peer_, *peer_closed_error());
    return false;
  }
  const int err = copy_cross_memory(endpoint_.pid, to_peer, local, remote, bytes);
  if (err == 0) return true;
  ErrorContext ctx = owner_.error_context(peer_, "transfer");
  ctx.cause = cross_memory_cause(err, to_peer, peer_, endpoint_.pid, bytes);
  owner_.fail_link(peer_, Error(cross_memory_error_kind(err), std::move(ctx)));
  return false;
}

void Connection::corrupt(const std::string& what) {
  ErrorContext ctx = owner_.error_context(peer_, "transfer");
  ctx.cause = "the shared-memory ring from rank " + std::to_string(peer_) +
              " holds invalid data (" + what + "); the link is closed";
  owner_.fail_link(peer_, Error(ErrorKind::protocol, std::move(ctx)));
}

bool Connection::peer_gone() const {
  if (exit_watch) return exit_watch->exited();
  return ::kill(endpoint_.pid, 0) != 0 && errno == ESRCH;
}

std::optional<Error> Connection::peer_closed_error() const {
  if (in_control_ == nullptr || in_control_->producer_closed.load(std::memory_order_acquire) == 0)
    return std::nullopt;
  const int cause = in_control_->close_cause.load(std::memory_order_relaxed);
  ErrorContext ctx = owner_.error_context(peer_, "transfer");
  const std::string closer = "rank " + std::to_string(peer_);
  if (cause >= 0 && cause < owner_.world_size() && cause != peer_ && cause != owner_.rank()) {
    ctx.peer = cause;  // name the rank whose loss started it
    ctx.cause = closer + " closed its link to this rank after it lost rank " +
                std::to_string(cause) + " (and withdrew the buffers it had offered)";
  } else {
    ctx.cause = closer + " closed its link to this rank (and withdrew the buffers it had offered)";
  }
  return Error(ErrorKind::peer_lost, std::move(ctx));
}

void Connection::revoke_offers(int cause_rank) {
  if (out_control_ == nullptr || state_ == State::connecting) return;
  out_control_->close_cause.store(cause_rank, std::memory_order_relaxed);
  out_control_->producer_closed.store(1, std::memory_order_seq_cst);
  wake_peer();  // asleep, it would learn only at the end of its sleep
  // The peer's accesses last as long as one copy; a peer that died inside one never leaves.
  const auto deadline = base::Clock::now() + std::chrono::seconds(10);
  while (out_control_->consumer_accessing.load(std::memory_order_seq_cst) != 0) {
    if (peer_gone()) return;
    if (base::Clock::now() >= deadline) {
      base::log("shm", base::LogLevel::error, "shm: rank ", peer_,
                " is still inside memory this rank offered it, 10 s after the link to it closed; "
                "going on (the buffers of the failed operations may still change)");
      return;
    }
    std::this_thread::yield();
  }
}

void Connection::close(const Error& error) {
  if (state_ == State::closed) return;
  const int cause = error.context().peer;
  revoke_offers(cause >= 0 && cause != peer_ ? cause : -1);
  state_ = State::closed;
  readable_.store(false, std::memory_order_relaxed);
  connecting_.store(false, std::memory_order_relaxed);
  blocked_.store(false, std::memory_order_relaxed);
  std::vector<SendDone> waiting;
  for (auto& p : sendq_)
    if (p.done) waiting.push_back(std::move(p.done));
  for (auto& [cookie, offered] : awaiting_ack_)
    if (offered.done) waiting.push_back(std::move(offered.done));
  sendq_.clear();
  awaiting_ack_.clear();
  controls_.clear();
  splits_.clear();
  goodbye_queued_ = false;
  for (auto& done : waiting) done(&error);
}

}  // namespace anview::transport::shm
