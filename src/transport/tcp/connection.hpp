// One TCP stream between this rank and a peer: a send queue written with writev, and a frame
// reader that lands payloads straight in the buffer the sink chose. Each stream belongs to one
// network path (a pair of interfaces). Private to transport/tcp.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "base/progress_engine.hpp"
#include "base/socket.hpp"
#include "base/tls.hpp"
#include "transport/tcp/handshake.hpp"
#include "transport/transport.hpp"

namespace anview::transport::tcp {

class TcpTransport;

// Frame types the transport keeps for itself (p2p uses types below 0xF0). They carry sequence
// number 0: they are never sent again after a path fails.
inline constexpr std::uint8_t frame_goodbye = 0xF0;
// The sender gives up the link because it lost another rank (arg: that rank); it closes next.
inline constexpr std::uint8_t frame_abort = 0xF1;
// Multi-path acknowledgement: tag = every ordered frame up to it arrived whole, id = every data
// chunk up to it (chunk numbers without the top bit) arrived whole.
inline constexpr std::uint8_t frame_ack = 0xF2;
// The sender closed path `arg` of generation `tag` and sends its unacknowledged frames again on
// other paths; it precedes them on every stream that carries them.
inline constexpr std::uint8_t frame_path_down = 0xF3;
// Keeps an idle path's acknowledgements flowing, so a dead path is noticed before it is needed.
inline constexpr std::uint8_t frame_keepalive = 0xF4;
// Receiver-driven flow control: the sender may write up to `arg` bytes (counted from the
// stream's start) on data stream `id & 0xFFFF` of path `tag`, generation `id >> 16`.
inline constexpr std::uint8_t frame_credit = 0xF5;

// What travels on a TCP stream: a sequence number (sequence.hpp; 0 for the transport's own
// frames), then the frame.
struct WireHeader {
  std::uint64_t seq = 0;
  FrameHeader frame;
};
static_assert(sizeof(WireHeader) == 40, "WireHeader is a wire format");

// Flow control counts the bytes of p2p frames only: the transport's own frames (which carry
// the credit itself) are never held back.
inline bool counts_for_credit(const WireHeader& h) {
  return h.frame.type < frame_goodbye;
}

class Connection final : public base::FdHandler {
 public:
  // In a job with a secret, awaiting_proof: the accepting side sent its challenge (the ack)
  // and reads nothing else before the connecting side's proof; awaiting_admission: the
  // connecting side sent its proof and waits to be admitted.
  // With TLS (ANVIEW_TLS=1), `securing` runs the TLS handshake first: after the connect on
  // the connecting side (then the hello goes out), before the hello on the accepting side.
  enum class State {
    connecting,
    securing,
    awaiting_hello,
    awaiting_ack,
    awaiting_proof,
    awaiting_admission,
    established,
    closed
  };

  // Takes ownership of a non-blocking socket and registers it with the engine. A `connecting`
  // socket (a connect in progress) sends `hello` once connected, then awaits the ack. With the
  // owner's TLS context, everything goes through a TLS session.
  Connection(TcpTransport& owner, base::Fd fd, State state, int peer, int stream, int path = 0,
             const Handshake* hello = nullptr, const std::string& remote = {});
  // Largest SO_RCVLOWAT used while a payload is arriving (ANVIEW_TCP_RCVLOWAT; 0: off).
  static std::size_t max_low_watermark();
  ~Connection() override;

  void on_fd_events(std::uint32_t events) override;

  // Queues a frame; writes at once when nothing is queued before it. `done` may run inside
  // this call. The payload must stay valid until `done` runs.
  void queue_send(const WireHeader& header, const void* payload, SendDone done);
  // The queued frame numbered `seq` (a copy sent again after a path failed) need not go out
  // any more: the peer acknowledged its first copy, and its payload may be freed now. Not
  // started, it is dropped, its `done` uncalled; started, it goes out from a copy of the rest.
  // True when it was dropped (the stream has room for more).
  bool withdraw(std::uint64_t seq);
  std::size_t queued_bytes() const { return queued_bytes_; }
  // Frames queued since the connection was made (an idle stream's count stands still).
  std::uint64_t frames_queued() const { return frames_queued_; }
  // Bytes written to and read from the socket since it was established (metrics).
  std::uint64_t bytes_sent() const { return bytes_sent_; }
  std::uint64_t bytes_received() const { return bytes_received_; }

  // Stops reading (the sink deferred a frame) or asks the transport's poller to go on.
  void pause_reading();
  // Re-offers a deferred frame to the sink and reads on; call from the transport's poller.
  void resume_reading();
  bool paused() const { return paused_; }
  // Reads everything the peer sent, up to the end of the stream, with no deferring: for a
  // peer that will send nothing more (it closed or died), so nothing it sent is lost.
  void drain();
  const std::string& remote() const { return remote_; }

  // Sends our half-close after the queue drains (shutdown(SHUT_WR)).
  void half_close();
  // Closes the socket and fails queued sends with `error` (null: closed cleanly). Idempotent.
  void close(const Error* error);

  State state() const { return state_; }
  void set_established(int peer, int stream);
  // The accepting side sent `ack` (its challenge) to `hello`: awaits the proof.
  void await_proof(const Handshake& hello, const Handshake& ack);
  // This connection's hello (sent or received) and the ack it got or sent: the proofs cover them.
  const Handshake& hello() const { return hello_; }
  const Handshake& ack() const { return ack_; }
  // The connecting side proved the secret in answer to `ack`: awaits its admission.
  void await_admission(const Handshake& ack) {
    ack_ = ack;
    state_ = State::awaiting_admission;
  }
  int peer() const { return peer_; }
  int stream() const { return stream_; }
  int path() const { return path_; }
  void set_path(int path) { path_ = path; }
  std::uint16_t generation() const { return generation_; }
  void set_generation(std::uint16_t g) { generation_ = g; }
  // The kernel's view of the connection (TCP_INFO). False when the socket cannot tell.
  struct KernelState {
    std::uint32_t unacked_ms = 0;     // since the peer acknowledged anything while data waits
                                      // for an acknowledgement; 0 when nothing is outstanding
    std::uint32_t rtt_us = 0;         // smoothed round-trip time
    std::uint64_t delivery_rate = 0;  // bytes per second, the kernel's latest estimate
    bool app_limited = false;         // ... taken while we had too little to send
  };
  bool kernel_state(KernelState* state) const;
  // Bytes that have not reached the peer yet: queued here plus unacknowledged in the kernel.
  std::size_t unsent_bytes() const;
  // Receiver-driven flow control of a data stream: the sender writes no further than `limit`
  // bytes since the stream was established (the receiver's latest grant; only ever raised),
  // and goes on writing when a grant raises it. The receiver keeps what it granted.
  void set_credit(std::uint64_t limit);
  bool credited() const { return credited_; }
  // "queued 1048616 B, sent 262144/524288 credited, granted 393216/131072 read" (hang reports).
  std::string flow_state() const;
  std::uint64_t granted() const { return granted_; }
  // Bytes of p2p frames (the transport's own frames do not count) read so far.
  std::uint64_t credited_received() const { return credited_received_; }
  void set_granted(std::uint64_t limit) { granted_ = limit; }
  // A landing for a payload that is read and dropped (a duplicate frame), owned by this stream.
  char* discard_landing(std::size_t bytes);
  bool is_discard(const void* data) const { return data != nullptr && data == discard_.data(); }
  // The frame being read is a copy of one taken before (sent again after a path failed): it
  // lands in the discard buffer and is not counted again.
  char* duplicate_landing(std::size_t bytes) {
    duplicate_ = true;
    return discard_landing(bytes);
  }
  bool duplicate() const { return duplicate_; }
  int fd() const { return fd_.get(); }
  // Best effort, for a link about to close: writes one header-only frame at once if nothing
  // is queued and the socket takes it whole; false otherwise (nothing was written).
  bool try_send_now(const WireHeader& header);
  bool eof() const { return eof_; }
  // Sends a handshake whole at once (a fresh connection's buffer takes it); false otherwise.
  bool send_handshake(const Handshake& h);
  bool encrypted() const { return tls_ != nullptr; }
  // The peer sent its goodbye on this stream: its end of stream is a clean departure.
  void mark_goodbye() { goodbye_ = true; }
  bool goodbye_received() const { return goodbye_; }
  std::string describe() const;  // "local <-> remote"

 private:
  struct Pending {
    WireHeader header;
    const char* payload;
    std::uint32_t bytes;  // payload bytes
    std::size_t sent;     // of header + payload
    SendDone done;
    std::unique_ptr<char[]> own;  // the payload, copied by withdraw(); else the caller's
  };

  void update_interest();
  void finish_connect();
  void continue_securing();
  // recv/readv/sendmsg on the socket, or through the TLS session.
  ssize_t receive(void* data, std::size_t bytes);
  ssize_t receive(iovec* iov, int count);
  ssize_t transmit(iovec* iov, int count);
  void flush();
  void read_available();
  bool read_handshake();
  // Parses frames from the rx buffer and the socket; false when reading must stop.
  bool read_frames();
  bool start_frame();
  void finish_frame();
  // err EPROTO through TLS: a protocol error with the session's reason instead.
  void fail(ErrorKind kind, const std::string& cause, int err = 0);
  void set_low_watermark(std::size_t bytes);  // SO_RCVLOWAT, only when it changes
  bool wait_for_any_byte();                   // the socket is empty: wake at the next byte

  TcpTransport& owner_;
  base::Fd fd_;
  State state_;
  int peer_;
  int stream_;
  int path_;
  std::uint16_t generation_ = 0;
  Handshake hello_{};  // sent once a `connecting` socket is connected; or received
  Handshake ack_{};
  bool want_write_ = false;
  bool reading_ = true;
  bool paused_ = false;
  bool half_close_pending_ = false;
  bool eof_ = false;
  bool goodbye_ = false;
  std::size_t low_watermark_ = 1;
  bool socket_drained_ = false;  // the last read was short: nothing more until epoll says so
  // Draining: the sink may not defer frames, and reading goes on to the end of the stream
  // (or the reset) at once, without waiting for readiness events.
  bool must_accept_ = false;
  std::uint32_t interest_ = EPOLLIN | EPOLLRDHUP;  // the events registered with epoll
  std::string remote_;  // the peer's address, kept for messages after a reset
  std::unique_ptr<base::tls::Session> tls_;
  State after_securing_ = State::awaiting_hello;

  std::deque<Pending> sendq_;
  std::size_t queued_bytes_ = 0;
  std::uint64_t frames_queued_ = 0;
  bool credited_ = false;
  std::uint64_t credit_limit_ = 0;       // sending: what the peer granted
  std::uint64_t credited_sent_ = 0;      // bytes of p2p frames written
  std::size_t uncounted_queued_ = 0;     // transport frames queued while credited
  std::uint64_t credited_received_ = 0;  // bytes of p2p frames read
  std::uint64_t granted_ = 0;            // receiving: what we granted the peer
  std::uint64_t bytes_sent_ = 0;
  std::uint64_t bytes_received_ = 0;

  static constexpr std::size_t rx_capacity = 64 * 1024;
  std::unique_ptr<char[]> rx_;
  std::size_t rx_head_ = 0;
  std::size_t rx_tail_ = 0;
  bool in_payload_ = false;
  WireHeader current_{};
  std::vector<char> discard_;
  bool duplicate_ = false;  // see duplicate_landing()
  char* landing_ = nullptr;
  std::uint32_t landed_ = 0;
};

}  // namespace anview::transport::tcp
