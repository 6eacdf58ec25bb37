#include "base/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace anview::base {

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string errno_text(int err) {
  const char* name = strerrorname_np(err);
  std::string text = name ? name : "errno " + std::to_string(err);
  text += " (";
  text += std::strerror(err);
  text += ")";
  return text;
}

Error sys_error(ErrorKind kind, ErrorContext context, const std::string& what, int err) {
  context.cause = what + ": " + errno_text(err);
  return Error(kind, std::move(context));
}

SockAddr SockAddr::from_host_port(const std::string& host, std::uint16_t port,
                                  const ErrorContext& context) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = host.empty() ? AI_PASSIVE : 0;
  addrinfo* result = nullptr;
  const std::string service = std::to_string(port);
  const int rc =
      ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0 || result == nullptr) {
    ErrorContext c = context;
    c.cause = "cannot resolve host '" + host + "': " + ::gai_strerror(rc);
    throw Error(ErrorKind::usage, std::move(c));
  }
  SockAddr addr;
  std::memcpy(&addr.storage, result->ai_addr, result->ai_addrlen);
  addr.length = result->ai_addrlen;
  ::freeaddrinfo(result);
  return addr;
}

bool split_host_port(const std::string& text, std::string* host, std::uint16_t* port) {
  std::string h;
  std::string p;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close != std::string::npos && close + 1 < text.size() && text[close + 1] == ':') {
      h = text.substr(1, close - 1);
      p = text.substr(close + 2);
    }
  } else if (const auto colon = text.rfind(':'); colon != std::string::npos) {
    h = text.substr(0, colon);
    p = text.substr(colon + 1);
    if (h.find(':') != std::string::npos) h.clear();  // a bare IPv6 address needs brackets
  }
  if (h.empty() || p.empty() || p.size() > 5 ||
      p.find_first_not_of("0123456789") != std::string::npos || std::stol(p) > 65535)
    return false;
  *host = h;
  *port = static_cast<std::uint16_t>(std::stol(p));
  return true;
}

SockAddr SockAddr::parse(const std::string& host_port, const ErrorContext& context) {
  std::string host;
  std::uint16_t port = 0;
  if (!split_host_port(host_port, &host, &port)) {
    ErrorContext c = context;
    c.cause = "'" + host_port + "' is not host:port";
    throw Error(ErrorKind::usage, std::move(c));
  }
  return from_host_port(host, port, context);
}

std::string SockAddr::host() const {
  char buf[INET6_ADDRSTRLEN] = {};
  if (storage.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&storage);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
  } else if (storage.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&storage);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
  }
  return buf;
}

std::uint16_t SockAddr::port() const {
  if (storage.ss_family == AF_INET)
    return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (storage.ss_family == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

std::string SockAddr::to_string() const {
  const std::string h = host();
  const std::string p = std::to_string(port());
  return storage.ss_family == AF_INET6 ? "[" + h + "]:" + p : h + ":" + p;
}

Fd listen_tcp(const SockAddr& bind_addr, int backlog, const ErrorContext& context) {
  Fd fd(::socket(bind_addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) throw sys_error(ErrorKind::internal, context, "socket()", errno);
  const int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&bind_addr.storage), bind_addr.length) !=
      0)
    throw sys_error(ErrorKind::usage, context, "bind(" + bind_addr.to_string() + ")", errno);
  if (::listen(fd.get(), backlog) != 0)
    throw sys_error(ErrorKind::internal, context, "listen()", errno);
  return fd;
}

SockAddr local_address(int fd) {
  SockAddr addr;
  addr.length = sizeof addr.storage;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr.storage), &addr.length);
  return addr;
}

SockAddr remote_address(int fd) {
  SockAddr addr;
  addr.length = sizeof addr.storage;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr.storage), &addr.length) != 0)
    addr.length = 0;
  return addr;
}

void set_nonblocking(int fd, bool on) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

void set_nodelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void set_buffer_sizes(int fd, int bytes) {
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}

namespace {

// A non-blocking socket for `addr`, bound to `bind_to` when given.
Fd connecting_socket(const SockAddr& addr, const SockAddr* bind_to, const ErrorContext& c) {
  Fd fd(::socket(addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) throw sys_error(ErrorKind::internal, c, "socket()", errno);
  if (bind_to != nullptr &&
      ::bind(fd.get(), reinterpret_cast<const sockaddr*>(&bind_to->storage), bind_to->length) != 0)
    throw sys_error(ErrorKind::link, c, "bind() to " + bind_to->to_string(), errno);
  return fd;
}

}  // namespace

Fd start_connect(const SockAddr& addr, const SockAddr* bind_to, const ErrorContext& context) {
  ErrorContext c = context;
  if (c.peer_address.empty()) c.peer_address = addr.to_string();
  Fd fd = connecting_socket(addr, bind_to, c);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.length) != 0 &&
      errno != EINPROGRESS)
    throw sys_error(ErrorKind::link, c, "connect()", errno);
  return fd;
}

Fd connect_tcp(const SockAddr& addr, Deadline deadline, const ErrorContext& context,
               const SockAddr* bind_to) {
  ErrorContext c = context;
  if (c.peer_address.empty()) c.peer_address = addr.to_string();
  auto backoff = std::chrono::milliseconds(2);
  for (;;) {
    Fd fd = connecting_socket(addr, bind_to, c);
    int err = 0;
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.length) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        // A signal ends poll() early with the socket still connecting: wait_ready goes on.
        wait_ready(fd.get(), POLLOUT, deadline, c, "connect");
        socklen_t len = sizeof err;
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      }
    }
    if (err == 0) {
      set_nonblocking(fd.get(), false);
      set_nodelay(fd.get());
      return fd;
    }
    const bool retry = err == ECONNREFUSED || err == ECONNRESET || err == ETIMEDOUT ||
                       err == EAGAIN || err == ENETUNREACH || err == EHOSTUNREACH;
    if (!retry) throw sys_error(ErrorKind::link, c, "connect()", err);
    if (Clock::now() + backoff >= deadline) {
      c.cause = "connect() kept failing until the deadline, last: " + errno_text(err);
      throw Error(ErrorKind::timeout, c);
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(100));
  }
}

void wait_ready(int fd, short events, Deadline deadline, const ErrorContext& context,
                const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, ms_left(deadline));
    if (n > 0) return;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw sys_error(ErrorKind::internal, context, "poll()", errno);
    ErrorContext c = context;
    c.cause = std::string(what) + " did not complete before the deadline";
    throw Error(ErrorKind::timeout, std::move(c));
  }
}

void transfer_all(int fd, char* data, std::size_t bytes, const IoStep& step, Deadline deadline,
                  const ErrorContext& context, const char* what) {
  while (bytes > 0) {
    short wait_for = POLLIN;
    const ssize_t n = step(data, bytes, &wait_for);
    if (n > 0) {
      data += n;
      bytes -= static_cast<std::size_t>(n);
    } else if (n == 0) {
      ErrorContext c = context;
      c.cause = "connection closed by the peer";
      throw Error(ErrorKind::link, std::move(c));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      wait_ready(fd, wait_for, deadline, context, wait_for == POLLOUT ? "write" : "read");
    } else if (errno != EINTR) {
      throw sys_error(ErrorKind::link, context, what, errno);
    }
  }
}

void write_all(int fd, const void* data, std::size_t bytes, Deadline deadline,
               const ErrorContext& context) {
  const IoStep send = [fd](char* p, std::size_t n, short* wait_for) {
    *wait_for = POLLOUT;
    return ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
  };
  transfer_all(fd, static_cast<char*>(const_cast<void*>(data)), bytes, send, deadline, context,
               "send()");
}

void read_all(int fd, void* data, std::size_t bytes, Deadline deadline,
              const ErrorContext& context) {
  const IoStep recv = [fd](char* p, std::size_t n, short*) {
    return ::recv(fd, p, n, MSG_DONTWAIT);
  };
  transfer_all(fd, static_cast<char*>(data), bytes, recv, deadline, context, "recv()");
}

}  // namespace anview::base
