// One TCP stream between this rank and a peer: a send queue written with writev, and a frame
// reader that lands payloads straight in the buffer the sink chose. Private to transport/tcp.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "base/progress_engine.hpp"
#include "base/socket.hpp"
#include "transport/tcp/handshake.hpp"
#include "transport/transport.hpp"

namespace anview::transport::tcp {

class TcpTransport;

// Frame types the transport keeps for itself (p2p uses types below 0xF0).
inline constexpr std::uint8_t frame_goodbye = 0xF0;
// The sender gives up the link because it lost another rank (arg: that rank); it closes next.
inline constexpr std::uint8_t frame_abort = 0xF1;

class Connection final : public base::FdHandler {
 public:
  enum class State { awaiting_hello, awaiting_ack, established, closed };

  // Takes ownership of a non-blocking socket and registers it with the engine.
  Connection(TcpTransport& owner, base::Fd fd, State state, int peer, int stream);
  // Largest SO_RCVLOWAT used while a payload is arriving (ANVIEW_TCP_RCVLOWAT; 0: off).
  static std::size_t max_low_watermark();
  ~Connection() override;

  void on_fd_events(std::uint32_t events) override;

  // Queues a frame; writes at once when nothing is queued before it. `done` may run inside
  // this call. The payload must stay valid until `done` runs.
  void queue_send(const FrameHeader& header, const void* payload, SendDone done);
  std::size_t queued_bytes() const { return queued_bytes_; }
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
  int peer() const { return peer_; }
  int stream() const { return stream_; }
  int fd() const { return fd_.get(); }
  // Best effort, for a link about to close: writes one header-only frame at once if nothing
  // is queued and the socket takes it whole; false otherwise (nothing was written).
  bool try_send_now(const FrameHeader& header);
  bool eof() const { return eof_; }
  // The peer sent its goodbye on this stream: its end of stream is a clean departure.
  void mark_goodbye() { goodbye_ = true; }
  bool goodbye_received() const { return goodbye_; }
  std::string describe() const;  // "local <-> remote"

 private:
  struct Pending {
    FrameHeader header;
    const char* payload;
    std::uint32_t bytes;  // payload bytes
    std::size_t sent;     // of header + payload
    SendDone done;
  };

  void update_interest();
  void flush();
  void read_available();
  bool read_handshake();
  // Parses frames from the rx buffer and the socket; false when reading must stop.
  bool read_frames();
  bool start_frame();
  void finish_frame();
  void fail(ErrorKind kind, const std::string& cause, int err = 0);
  void set_low_watermark(std::size_t bytes);  // SO_RCVLOWAT, only when it changes

  TcpTransport& owner_;
  base::Fd fd_;
  State state_;
  int peer_;
  int stream_;
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

  std::deque<Pending> sendq_;
  std::size_t queued_bytes_ = 0;
  std::uint64_t bytes_sent_ = 0;
  std::uint64_t bytes_received_ = 0;

  static constexpr std::size_t rx_capacity = 64 * 1024;
  std::unique_ptr<char[]> rx_;
  std::size_t rx_head_ = 0;
  std::size_t rx_tail_ = 0;
  bool in_payload_ = false;
  FrameHeader current_{};
  char* landing_ = nullptr;
  std::uint32_t landed_ = 0;
};

}  // namespace anview::transport::tcp
