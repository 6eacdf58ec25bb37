// Thin, checked wrappers over BSD sockets shared by the TCP store and the TCP transport.
// Every blocking helper takes a deadline; every failure is an anview::Error built from the
// caller's context (rank, peer, operation) plus the syscall and errno.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "anview/error.hpp"
#include "base/clock.hpp"

namespace anview::base {

// Owns a file descriptor; closes it on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// An IPv4 or IPv6 socket address.
struct SockAddr {
  sockaddr_storage storage{};
  socklen_t length = 0;

  // "host:port", "[v6]:port". Resolves names with getaddrinfo; usage Error on a bad string.
  static SockAddr parse(const std::string& host_port, const ErrorContext& context);
  static SockAddr from_host_port(const std::string& host, std::uint16_t port,
                                 const ErrorContext& context);
  std::string to_string() const;  // "host:port" ("[v6]:port")
  std::string host() const;
  std::uint16_t port() const;
  int family() const { return storage.ss_family; }
};

// Splits "host:port" or "[v6]:port" without resolving anything; false when the text is not
// of that form (a bare IPv6 address needs brackets) or the port is not in 0..65535.
bool split_host_port(const std::string& text, std::string* host, std::uint16_t* port);

// "ECONNREFUSED (Connection refused)".
std::string errno_text(int err);
// Builds an Error of `kind` with context.cause = what + ": " + errno_text(err).
Error sys_error(ErrorKind kind, ErrorContext context, const std::string& what, int err);

// A listening TCP socket bound to `bind_addr` (port 0 picks a free port). Non-blocking,
// close-on-exec, SO_REUSEADDR.
Fd listen_tcp(const SockAddr& bind_addr, int backlog, const ErrorContext& context);
// The address a socket is bound to (getsockname) or connected to (getpeername).
SockAddr local_address(int fd);
SockAddr remote_address(int fd);

// Connects before the deadline, retrying refused connections (the peer may not listen yet)
// every few milliseconds. Returns a blocking socket with TCP_NODELAY set.
// With `bind_to`, the socket is bound to that local address first (its port 0: any), so the
// connection leaves through that address's interface.
Fd connect_tcp(const SockAddr& addr, Deadline deadline, const ErrorContext& context,
               const SockAddr* bind_to = nullptr);
// Starts a non-blocking connect (bound to `bind_to` when given) and returns the socket at once;
// writability then tells it completed, SO_ERROR whether it worked. Raises a link Error when
// the attempt fails at once (no route, a bad local address).
Fd start_connect(const SockAddr& addr, const SockAddr* bind_to, const ErrorContext& context);

void set_nonblocking(int fd, bool on);
void set_nodelay(int fd);
void set_buffer_sizes(int fd, int bytes);  // SO_SNDBUF and SO_RCVBUF; best effort

// Blocking exact-length I/O with a deadline, for handshakes and the store. Raises a timeout
// Error at the deadline, a link Error when the peer closes or resets.
// Waits until fd is ready for `events` (POLLIN, POLLOUT); a timeout Error naming `what` at
// the deadline.
void wait_ready(int fd, short events, Deadline deadline, const ErrorContext& context,
                const char* what);
// One step of a blocking transfer: like recv or send on a non-blocking socket (bytes moved,
// 0 at the end of the stream, -1 with errno); on EAGAIN it sets *wait_for to POLLIN or POLLOUT.
using IoStep = std::function<ssize_t(char* data, std::size_t bytes, short* wait_for)>;
// Moves all `bytes` with `step` before the deadline: a timeout Error at the deadline, a link
// Error at the end of the stream or on a socket error (`what` names the call).
void transfer_all(int fd, char* data, std::size_t bytes, const IoStep& step, Deadline deadline,
                  const ErrorContext& context, const char* what);
void write_all(int fd, const void* data, std::size_t bytes, Deadline deadline,
               const ErrorContext& context);
void read_all(int fd, void* data, std::size_t bytes, Deadline deadline,
              const ErrorContext& context);

}  // namespace anview::base
