#include "transport/tcp/connection.hpp"

#include <linux/sockios.h>
#include <linux/tcp.h>  // struct tcp_info with the delivery rate (glibc's lacks it)
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "base/config.hpp"
#include "base/log.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace anview::transport::tcp {
namespace {

constexpr std::size_t header_bytes = sizeof(WireHeader);
constexpr int max_iov = 64;

const base::Setting rcvlowat_setting(
    "tcp", "ANVIEW_TCP_RCVLOWAT", "256K",
    "While a large payload arrives, wake the reader only when this much of it is there "
    "(SO_RCVLOWAT; 0: wake for every segment)");

}  // namespace

std::size_t Connection::max_low_watermark() {
  static const std::size_t value = static_cast<std::size_t>(rcvlowat_setting.as_int());
  return value;
}

Connection::Connection(TcpTransport& owner, base::Fd fd, State state, int peer, int stream,
                       int path, const Handshake* hello, const std::string& remote)
    : owner_(owner),
      fd_(std::move(fd)),
      state_(state),
      peer_(peer),
      stream_(stream),
      path_(path),
      rx_(new char[rx_capacity]) {
  base::set_nonblocking(fd_.get(), true);
  base::set_nodelay(fd_.get());
  if (hello != nullptr) hello_ = *hello;
  if (const base::tls::Context* tls = owner_.tls()) {
    const bool client = state_ == State::connecting;
    tls_ = std::make_unique<base::tls::Session>(
        *tls, fd_.get(), client ? base::tls::Role::client : base::tls::Role::server);
    if (!client) {
      after_securing_ = state_;
      state_ = State::securing;
    }
  }
  if (state_ == State::connecting) interest_ = EPOLLOUT;
  owner_.engine().add_fd(fd_.get(), interest_, this);
  remote_ = state_ == State::connecting ? remote : base::remote_address(fd_.get()).to_string();
}

void Connection::finish_connect() {
  int err = 0;
  socklen_t len = sizeof err;
  if (::getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err != 0) {
    fail(ErrorKind::link, "connect() to " + remote_ + " failed", err);
    return;
  }
  if (tls_) {
    state_ = State::securing;
    after_securing_ = State::awaiting_ack;
    continue_securing();
    return;
  }
  if (!send_handshake(hello_)) {
    fail(ErrorKind::link, "could not send the hello to " + remote_, errno);
    return;
  }
  state_ = State::awaiting_ack;
  update_interest();
}

void Connection::continue_securing() {
  switch (tls_->handshake()) {
    case base::tls::Session::Step::want_read:
    case base::tls::Session::Step::want_write:
      want_write_ = tls_->wants_write();
      reading_ = !want_write_;
      update_interest();
      return;
    case base::tls::Session::Step::failed:
      if (tls_->plaintext_peer()) {
        // An Anview peer without TLS: tell it in its own protocol, so its error names the
        // cause. Other plain text (garbage, a scanner) gets no answer.
        std::uint32_t magic = 0;
        if (::recv(fd_.get(), &magic, sizeof magic, MSG_PEEK | MSG_DONTWAIT) ==
                static_cast<ssize_t>(sizeof magic) &&
            magic == handshake_magic) {
          // Its hello is read first: a close with unread data would reset the connection
          // and could lose the reject.
          Handshake hello;
          [[maybe_unused]] const ssize_t got =
              ::recv(fd_.get(), &hello, sizeof hello, MSG_DONTWAIT);
          const Handshake reject = owner_.plaintext_reject();
          [[maybe_unused]] const ssize_t n =
              ::send(fd_.get(), &reject, sizeof reject, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
      }
      fail(ErrorKind::auth, tls_->failure());
      return;
    case base::tls::Session::Step::done:
      break;
  }
  state_ = after_securing_;
  want_write_ = false;
  reading_ = true;
  if (state_ == State::awaiting_ack && !send_handshake(hello_)) {
    fail(ErrorKind::link, "could not send the hello to " + remote_, errno);
    return;
  }
  update_interest();
  read_available();  // what arrived with the handshake's last record
}

bool Connection::send_handshake(const Handshake& h) {
  const ssize_t n = tls_ ? tls_->write(&h, sizeof h)
                         : ::send(fd_.get(), &h, sizeof h, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n == static_cast<ssize_t>(sizeof h)) return true;
  if (n >= 0) errno = EAGAIN;
  return false;
}

ssize_t Connection::receive(void* data, std::size_t bytes) {
  return tls_ ? tls_->read(data, bytes) : ::recv(fd_.get(), data, bytes, 0);
}

ssize_t Connection::receive(iovec* iov, int count) {
  return tls_ ? tls_->readv(iov, count) : ::readv(fd_.get(), iov, count);
}

ssize_t Connection::transmit(iovec* iov, int count) {
  if (tls_) return tls_->writev(iov, count);
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = static_cast<std::size_t>(count);
  return ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}

void Connection::set_credit(std::uint64_t limit) {
  credited_ = true;
  if (limit <= credit_limit_) return;
  credit_limit_ = limit;
  if (!want_write_ && !sendq_.empty() && state_ == State::established) flush();
}

std::string Connection::flow_state() const {
  std::string text = "queued " + std::to_string(queued_bytes_) + " B";
  if (credited_)
    text += ", sent " + std::to_string(credited_sent_) + "/" + std::to_string(credit_limit_) +
            " credited";
  if (granted_ > 0)
    text += ", granted " + std::to_string(granted_) + "/" + std::to_string(credited_received_) +
            " read";
  if (paused_) text += ", reading paused";
  return text;
}

char* Connection::discard_landing(std::size_t bytes) {
  if (discard_.size() < bytes) discard_.resize(bytes);
  return discard_.data();
}

bool Connection::kernel_state(KernelState* state) const {
  if (!fd_.valid()) return false;
  tcp_info info{};
  socklen_t len = sizeof info;
  if (::getsockopt(fd_.get(), IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return false;
  // Unacknowledged data, or probes of the peer's closed window that went unanswered. A peer
  // that does not read (its window closed) answers our kernel's probes, at growing gaps, and
  // its kernel limits those answers to one per 500 ms (tcp_invalid_ratelimit): one probe out
  // (and the probes' backoff) is such a peer, not a dead path; a second probe unanswered is.
  // (Counted as unacknowledged, the probe and the backoff made a path whose peer was busy for
  // half a second fail over, and after ANVIEW_TCP_LINK_TIMEOUT the whole link fail.)
  const bool outstanding = info.tcpi_unacked > 0 || info.tcpi_probes > 1;
  state->unacked_ms = outstanding ? info.tcpi_last_ack_recv : 0;
  state->rtt_us = info.tcpi_rtt;
  state->delivery_rate = info.tcpi_delivery_rate;
  state->app_limited = info.tcpi_delivery_rate_app_limited != 0;
  return true;
}

std::size_t Connection::unsent_bytes() const {
  int in_kernel = 0;
  if (!fd_.valid() || ::ioctl(fd_.get(), SIOCOUTQ, &in_kernel) != 0) in_kernel = 0;
  return queued_bytes_ + static_cast<std::size_t>(std::max(in_kernel, 0));
}

Connection::~Connection() {
  if (fd_.valid()) owner_.engine().remove_fd(fd_.get());
}

std::string Connection::describe() const {
  if (!fd_.valid()) return "closed, was " + remote_;
  return base::local_address(fd_.get()).to_string() + " <-> " + remote_ +
         (tls_ ? " (" + tls_->describe() + ")" : "");
}

void Connection::set_established(int peer, int stream) {
  peer_ = peer;
  stream_ = stream;
  state_ = State::established;
}

void Connection::on_fd_events(std::uint32_t events) {
  if (state_ == State::closed) return;
  if (state_ == State::connecting) {
    if (events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) finish_connect();
    return;
  }
  if (state_ == State::securing) {
    continue_securing();
    return;
  }
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLERR | EPOLLHUP)) {
    if (reading_) {
      read_available();
    } else if (events & (EPOLLRDHUP | EPOLLERR | EPOLLHUP)) {
      // Paused with a frame deferred, and the peer has finished sending (it closed or died):
      // what is left in the socket is all there will be, so take it now, past the sink's
      // budget, and reach the end of the stream instead of waiting for a receive.
      drain();
      return;
    }
  }
  if (state_ == State::closed) return;
  if (events & EPOLLOUT) flush();
}

void Connection::update_interest() {
  if (state_ == State::closed) return;
  // After the end of the stream the peer's half-close stays "ready": stop listening for it.
  std::uint32_t events = eof_ ? 0u : static_cast<std::uint32_t>(EPOLLRDHUP);
  if (reading_) events |= EPOLLIN;
  if (want_write_) events |= EPOLLOUT;
  if (events != interest_) {
    owner_.engine().modify_fd(fd_.get(), events, this);
    interest_ = events;
  }
}

bool Connection::try_send_now(const WireHeader& header) {
  if (!sendq_.empty() || state_ != State::established) return false;
  // Through TLS: one record, out whole or held by OpenSSL (harmless: the link closes next).
  if (tls_ && tls_->write_stalled()) return false;
  const ssize_t n = tls_ ? tls_->write(&header, header_bytes)
                         : ::send(fd_.get(), &header, header_bytes, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n != static_cast<ssize_t>(header_bytes)) return false;  // no partial write of 40 bytes
  bytes_sent_ += header_bytes;
  return true;
}

void Connection::queue_send(const WireHeader& header, const void* payload, SendDone done) {
  Pending p{header, static_cast<const char*>(payload), header.frame.payload_bytes, 0,
            std::move(done)};
  queued_bytes_ += header_bytes + header.frame.payload_bytes;
  ++frames_queued_;
  if (credited_ && !counts_for_credit(header)) {
    // The transport's own frames (credit, acknowledgements) pass the p2p frames waiting for
    // credit: behind the frame being written and earlier frames of their kind. Otherwise two
    // ranks could each hold the other's credit behind data that waits for it.
    // A TLS record that did not go out whole (encrypted already, offered again as it is)
    // started every frame it holds bytes of: not only the first one.
    auto at = sendq_.begin();
    std::size_t held = tls_ ? tls_->stalled_bytes() : 0;
    if (at != sendq_.end() && at->sent > 0 && held == 0) ++at;
    for (; at != sendq_.end() && held > 0; ++at)
      held -= std::min(held, header_bytes + at->bytes - at->sent);
    while (at != sendq_.end() && !counts_for_credit(at->header)) ++at;
    sendq_.insert(at, std::move(p));
    ++uncounted_queued_;
    flush();
    return;
  }
  sendq_.push_back(std::move(p));
  if (sendq_.size() == 1) flush();
}

bool Connection::withdraw(std::uint64_t seq) {
  for (auto it = sendq_.begin(); it != sendq_.end(); ++it) {
    if (it->header.seq != seq) continue;
    // A TLS record that did not go out whole (encrypted already, offered again as it is) may
    // hold the first bytes of any frame near the front: while one waits, nothing is dropped.
    const bool started = it->sent > 0 || (tls_ && tls_->write_stalled());
    if (!started) {
      queued_bytes_ -= header_bytes + it->bytes;
      if (credited_ && !counts_for_credit(it->header) && uncounted_queued_ > 0) --uncounted_queued_;
      sendq_.erase(it);
      return true;
    }
    if (it->own || it->bytes == 0) return false;
    // The same bytes at the same offsets (a TLS session may write from the moved buffer).
    const std::size_t from = it->sent > header_bytes ? it->sent - header_bytes : 0;
    it->own.reset(new char[it->bytes]);
    std::memcpy(it->own.get() + from, it->payload + from, it->bytes - from);
    it->payload = it->own.get();
    return false;
  }
  return false;
}

void Connection::flush() {
  std::vector<SendDone> completed;
  bool blocked = false;  // out of credit: the receiver has not made room yet
  while (!sendq_.empty() && state_ != State::closed) {
    iovec iov[max_iov];
    int count = 0;
    // With credit, p2p frames are written up to the receiver's grant (cutting a frame if need
    // be); the transport's own frames (acknowledgements, credit) never wait for it.
    std::size_t budget = SIZE_MAX;
    if (credited_)
      budget = credit_limit_ > credited_sent_
                   ? static_cast<std::size_t>(credit_limit_ - credited_sent_)
                   : 0;
    for (auto it = sendq_.begin(); it != sendq_.end() && count + 2 <= max_iov; ++it) {
      std::size_t room = header_bytes + it->bytes - it->sent;
      const bool counted = credited_ && counts_for_credit(it->header);
      // A frame cut at the credit is finished past it when the transport's frames wait behind.
      if (counted && !(it->sent > 0 && uncounted_queued_ > 0)) room = std::min(room, budget);
      if (room == 0) break;
      std::size_t at = it->sent;
      const std::size_t end = it->sent + room;
      if (at < header_bytes) {
        const std::size_t n = std::min(end, header_bytes) - at;
        iov[count++] = {reinterpret_cast<char*>(&it->header) + at, n};
        at += n;
      }
      if (end > at) iov[count++] = {const_cast<char*>(it->payload) + (at - header_bytes), end - at};
      if (counted) {
        budget -= std::min(budget, room);
        if (end < header_bytes + it->bytes) break;  // cut: nothing may pass it
      }
    }
    if (count == 0) {
      blocked = true;
      break;
    }
    const ssize_t n = transmit(iov, count);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      fail(ErrorKind::peer_lost, "sendmsg() failed", errno);
      break;
    }
    std::size_t left = static_cast<std::size_t>(n);
    queued_bytes_ -= left;
    bytes_sent_ += left;
    while (left > 0) {
      Pending& p = sendq_.front();
      const std::size_t rest = header_bytes + p.bytes - p.sent;
      if (counts_for_credit(p.header)) credited_sent_ += std::min(left, rest);
      if (left < rest) {
        p.sent += left;
        break;
      }
      if (credited_ && !counts_for_credit(p.header) && uncounted_queued_ > 0) --uncounted_queued_;
      left -= rest;
      completed.push_back(std::move(p.done));
      sendq_.pop_front();
    }
  }
  want_write_ = !sendq_.empty() && state_ != State::closed && !blocked;
  update_interest();
  if (sendq_.empty() && half_close_pending_ && state_ != State::closed) {
    if (tls_) tls_->close_notify();
    ::shutdown(fd_.get(), SHUT_WR);
    half_close_pending_ = false;
  }
  for (auto& done : completed)
    if (done) done(nullptr);
  if (!completed.empty() && state_ == State::established) owner_.on_stream_room(*this);
}

void Connection::half_close() {
  half_close_pending_ = true;
  if (sendq_.empty() && state_ != State::closed) {
    if (tls_) tls_->close_notify();
    ::shutdown(fd_.get(), SHUT_WR);
    half_close_pending_ = false;
  }
}

void Connection::pause_reading() {
  reading_ = false;
  paused_ = true;
  update_interest();
}

void Connection::resume_reading() {
  if (state_ == State::closed) return;
  paused_ = false;
  reading_ = true;
  update_interest();
  read_available();
}

void Connection::drain() {
  if (state_ == State::closed || eof_) return;
  must_accept_ = true;
  resume_reading();
}

void Connection::close(const Error* error) {
  if (state_ == State::closed) return;
  // A frame cut off in the middle: its sender sends it again on another path, and the rest
  // must land where this part went.
  // (A frame the sink refused is recorded too, without a landing: its copy is counted when it
  // ends, as the frame itself would have been; a duplicate was counted before.)
  if (in_payload_ && state_ == State::established && !duplicate_)
    owner_.on_frame_interrupted(*this, current_, is_discard(landing_) ? nullptr : landing_);
  in_payload_ = false;
  state_ = State::closed;
  owner_.engine().remove_fd(fd_.get());
  fd_.reset();
  std::deque<Pending> failed;
  failed.swap(sendq_);
  queued_bytes_ = 0;
  uncounted_queued_ = 0;
  const Error closed(ErrorKind::link, owner_.error_context(peer_, "send"));
  for (auto& p : failed)
    if (p.done) p.done(error ? error : &closed);
}

void Connection::fail(ErrorKind kind, const std::string& cause, int err) {
  ErrorContext context =
      owner_.error_context(peer_, state_ == State::established ? "transfer" : "handshake");
  if (err == EPROTO && tls_) {
    // Through TLS, EPROTO is the session's failure (bad records, a broken peer): say that.
    kind = ErrorKind::protocol;
    context.cause = tls_->failure();
  } else {
    context.cause = err ? cause + ": " + base::errno_text(err) : cause;
  }
  owner_.on_connection_error(*this, Error(kind, std::move(context)));
}

bool Connection::wait_for_any_byte() {
  // A threshold set while an earlier payload was arriving must not outlive it: the next frame
  // may be smaller (a paused stream resumes, a read that filled the buffers meets EAGAIN).
  set_low_watermark(1);
  return true;
}

void Connection::set_low_watermark(std::size_t bytes) {
  if (bytes == low_watermark_) return;
  const int value = static_cast<int>(bytes);
  if (::setsockopt(fd_.get(), SOL_SOCKET, SO_RCVLOWAT, &value, sizeof value) == 0)
    low_watermark_ = bytes;
}

void Connection::await_proof(const Handshake& hello, const Handshake& ack) {
  hello_ = hello;
  ack_ = ack;
  state_ = State::awaiting_proof;
}

void Connection::read_available() {
  socket_drained_ = false;
  while (state_ == State::awaiting_hello || state_ == State::awaiting_ack ||
         state_ == State::awaiting_proof || state_ == State::awaiting_admission) {
    if (!read_handshake()) return;
  }
  if (state_ == State::established) {
    read_frames();
    if (state_ == State::established) owner_.on_read_idle(*this);
  }
}

bool Connection::read_handshake() {
  // Exactly the handshake's bytes, so that frames behind it stay in the socket: its shared
  // prefix first, then the rest when the version is ours (another version's reply is read as
  // its prefix, which names the version).
  std::size_t want = handshake_prefix_bytes;
  for (;;) {
    if (rx_tail_ >= handshake_prefix_bytes) {
      Handshake prefix;
      std::memcpy(static_cast<void*>(&prefix), rx_.get(), handshake_prefix_bytes);
      if (prefix.magic == handshake_magic && prefix.version == protocol_version)
        want = sizeof(Handshake);
    }
    if (rx_tail_ >= want) break;
    const ssize_t n = receive(rx_.get() + rx_tail_, want - rx_tail_);
    if (n > 0) {
      rx_tail_ += static_cast<std::size_t>(n);
    } else if (n == 0) {
      fail(ErrorKind::link,
           "connection closed during the handshake after " + std::to_string(rx_tail_) + " bytes");
      return false;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return false;
    } else if (errno != EINTR) {
      fail(ErrorKind::link, "recv() during the handshake", errno);
      return false;
    }
  }
  Handshake h;
  std::memcpy(static_cast<void*>(&h), rx_.get(), want);  // a shorter one keeps its defaults
  rx_head_ = rx_tail_ = 0;
  const State before = state_;
  if (state_ == State::awaiting_hello) {
    owner_.on_hello(*this, h);
  } else if (state_ == State::awaiting_proof) {
    owner_.on_proof(*this, h);
  } else if (state_ == State::awaiting_admission) {
    owner_.on_admission(*this, h);
  } else {
    owner_.on_ack(*this, h);
  }
  // Went on to the next step (a proof, or frames): read what follows.
  return state_ != before && state_ != State::closed;
}

bool Connection::read_frames() {
  while (reading_ && state_ == State::established) {
    const std::size_t buffered = rx_tail_ - rx_head_;
    if (in_payload_) {
      const std::size_t need = current_.frame.payload_bytes - landed_;
      if (buffered > 0) {
        const std::size_t n = std::min(buffered, need);
        std::memcpy(landing_ + landed_, rx_.get() + rx_head_, n);
        rx_head_ += n;
        landed_ += static_cast<std::uint32_t>(n);
        if (counts_for_credit(current_)) credited_received_ += n;
        if (landed_ == current_.frame.payload_bytes) finish_frame();
        continue;
      }
      // Read the payload straight into its landing place; whatever follows goes to rx_.
      rx_head_ = rx_tail_ = 0;
      iovec iov[2] = {{landing_ + landed_, need}, {rx_.get(), rx_capacity}};
      if (socket_drained_ && !must_accept_) {
        // The rest of this payload is sure to come: ask epoll to wake us only once a good
        // part of it is there, not for every 64 KiB segment.
        // With credit, no more than the sender may still send: it waits for our next grant.
        std::size_t wake = std::min(need, max_low_watermark());
        if (granted_ > 0)
          wake = std::min<std::size_t>(
              wake, granted_ > credited_received_ ? granted_ - credited_received_ : 1);
        // (Not through TLS: OpenSSL may hold part of the payload's last record already.)
        if (max_low_watermark() > 1 && !tls_) set_low_watermark(std::max<std::size_t>(wake, 1));
        return true;
      }
      const ssize_t n = receive(iov, 2);
      if (n > 0) {
        const auto got = static_cast<std::size_t>(n);
        bytes_received_ += got;
        socket_drained_ = got < need + rx_capacity;
        if (got <= need) {
          landed_ += static_cast<std::uint32_t>(got);
        } else {
          landed_ = current_.frame.payload_bytes;
          rx_tail_ = got - need;
        }
        if (counts_for_credit(current_)) credited_received_ += std::min(got, need);
        if (landed_ == current_.frame.payload_bytes) finish_frame();
        continue;
      }
      if (n == 0) {
        eof_ = true;
        fail(ErrorKind::peer_lost, "connection closed in the middle of a " +
                                       std::to_string(current_.frame.payload_bytes) +
                                       "-byte frame");
        return false;
      }
      if (errno == EAGAIN || errno == EWOULDBLOCK) return wait_for_any_byte();
      if (errno == EINTR) continue;
      fail(ErrorKind::peer_lost, "readv() failed", errno);
      return false;
    }
    if (buffered >= header_bytes) {
      if (!start_frame()) return false;
      continue;
    }
    if (rx_head_ > 0) {
      std::memmove(rx_.get(), rx_.get() + rx_head_, buffered);
      rx_head_ = 0;
      rx_tail_ = buffered;
    }
    if (socket_drained_ && !must_accept_) return wait_for_any_byte();  // a header may be all
    const ssize_t n = receive(rx_.get() + rx_tail_, rx_capacity - rx_tail_);
    if (n > 0) {
      // A short read emptied the socket: parse what we have and wait for the next readiness
      // event (epoll is level-triggered) instead of paying a recv() that says EAGAIN.
      socket_drained_ = static_cast<std::size_t>(n) < rx_capacity - rx_tail_;
      rx_tail_ += static_cast<std::size_t>(n);
      bytes_received_ += static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) {
      eof_ = true;
      reading_ = false;  // an ended stream stays readable: stop listening for it
      update_interest();
      if (buffered > 0) {
        fail(ErrorKind::peer_lost, "connection closed after a truncated frame header (" +
                                       std::to_string(buffered) + " of " +
                                       std::to_string(header_bytes) + " bytes)");
      } else {
        owner_.on_connection_eof(*this);
      }
      return false;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) return wait_for_any_byte();
    if (errno == EINTR) continue;
    fail(ErrorKind::peer_lost, "recv() failed", errno);
    return false;
  }
  return false;
}

bool Connection::start_frame() {
  std::memcpy(&current_, rx_.get() + rx_head_, header_bytes);
  if (current_.frame.reserved != 0 || current_.frame.payload_bytes > owner_.max_frame()) {
    fail(ErrorKind::protocol, "bad frame header (type " + std::to_string(current_.frame.type) +
                                  ", reserved " + std::to_string(current_.frame.reserved) +
                                  ", payload " + std::to_string(current_.frame.payload_bytes) +
                                  " bytes, limit " + std::to_string(owner_.max_frame()) +
                                  ", ANVIEW_MAX_FRAME)");
    return false;
  }
  duplicate_ = false;
  const Landing landing = owner_.deliver_frame(*this, current_, !must_accept_);
  if (state_ == State::closed) return false;
  if (landing.defer) {
    pause_reading();  // the header stays in rx_ and is offered again on resume
    return false;
  }
  rx_head_ += header_bytes;
  if (counts_for_credit(current_)) credited_received_ += header_bytes;
  landing_ = static_cast<char*>(landing.data);
  landed_ = 0;
  in_payload_ = true;
  if (current_.frame.payload_bytes == 0) finish_frame();
  return true;
}

void Connection::finish_frame() {
  in_payload_ = false;
  owner_.deliver_frame_done(*this, current_, landing_);
}

}  // namespace anview::transport::tcp
