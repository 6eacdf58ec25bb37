#include "core/metrics_server.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "anview/metrics.hpp"
#include "base/config.hpp"
#include "base/log.hpp"
#include "bootstrap/launch_env.hpp"

namespace anview::detail {
namespace {

const base::Setting port_setting(
    "core", "ANVIEW_METRICS_PORT", "",
    "Serve metrics over HTTP on this port plus the local rank: GET /metrics (Prometheus), "
    "GET /metrics.json (empty: off)");
const base::Setting addr_setting("core", "ANVIEW_METRICS_ADDR", "0.0.0.0",
                                 "Address the metrics endpoint listens on");

// The rank among the ranks of this host, as the launcher says; else the communicator rank.
int local_rank(int rank) {
  try {
    const auto launch = bootstrap::detect_launch();
    if (launch.world_size > 1 || launch.rank > 0) return launch.local_rank;
  } catch (const std::exception&) {
    // Not started by a launcher (Communicator::create): the communicator's rank it is.
  }
  return rank;
}

std::string response(int code, const char* reason, const char* type, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
         body;
}

}  // namespace

MetricsServer& MetricsServer::instance() {
  static MetricsServer* server = new MetricsServer();  // never destroyed, like its users
  return *server;
}

void MetricsServer::attach(int rank) {
  if (!port_setting.from_environment() || port_setting.value().empty()) return;
  std::lock_guard lock(mu_);
  if (users_++ > 0) return;
  const auto base_port = port_setting.as_int();
  const auto port = base_port + local_rank(rank);
  if (base_port <= 0 || port > 65535) {
    base::log("core", base::LogLevel::warn, "ANVIEW_METRICS_PORT=", base_port,
              " plus the local rank is no TCP port; no metrics endpoint");
    return;
  }
  start(static_cast<int>(port));
}

void MetricsServer::detach() {
  if (!port_setting.from_environment() || port_setting.value().empty()) return;
  std::lock_guard lock(mu_);
  if (--users_ == 0) stop();
}

void MetricsServer::start(int port) {
  const std::string where = addr_setting.value() + ":" + std::to_string(port);
  try {
    const ErrorContext context{.operation = "metrics endpoint"};
    listen_ = base::listen_tcp(base::SockAddr::parse(where, context), 16, context);
  } catch (const Error& e) {
    base::log("core", base::LogLevel::warn, "no metrics endpoint on ", where, ": ", e.cause(),
              " (ANVIEW_METRICS_PORT + the local rank must be free)");
    return;
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    listen_.reset();
    return;
  }
  wake_read_.reset(fds[0]);
  wake_write_.reset(fds[1]);
  base::log("core", base::LogLevel::info, "metrics at http://", where, "/metrics");
  thread_ =
      std::thread([this, wake = wake_read_.get(), listen = listen_.get()] { serve(wake, listen); });
}

void MetricsServer::stop() {
  if (!thread_.joinable()) return;
  const char stop = 's';
  [[maybe_unused]] ssize_t n = ::write(wake_write_.get(), &stop, 1);
  thread_.join();
  wake_read_.reset();
  wake_write_.reset();
  listen_.reset();
}

void MetricsServer::serve(int wake_fd, int listen_fd) {
  for (;;) {
    pollfd fds[2] = {{wake_fd, POLLIN, 0}, {listen_fd, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents != 0) return;  // stop (or the pipe broke)
    if ((fds[1].revents & POLLIN) == 0) continue;
    base::Fd client(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
    if (client.valid()) answer(client.get());
  }
}

void MetricsServer::answer(int client_fd) {
  const timeval timeout{2, 0};  // a client that stalls cannot hold the endpoint
  ::setsockopt(client_fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  ::setsockopt(client_fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  std::string request;
  char buf[1024];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < 8192) {
    const ssize_t n = ::recv(client_fd, buf, sizeof buf, 0);
    if (n <= 0) return;
    request.append(buf, static_cast<std::size_t>(n));
  }
  const auto line_end = request.find("\r\n");
  const std::string line = request.substr(0, line_end);
  std::string reply;
  if (line.rfind("GET ", 0) != 0) {
    reply = response(405, "Method Not Allowed", "text/plain", "GET only\n");
  } else {
    const auto path_end = line.find(' ', 4);
    std::string path =
        line.substr(4, path_end == std::string::npos ? std::string::npos : path_end - 4);
    if (const auto q = path.find('?'); q != std::string::npos) path.resize(q);
    if (path == "/metrics")
      reply = response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", metrics_prometheus());
    else if (path == "/metrics.json")
      reply = response(200, "OK", "application/json", metrics_json());
    else
      reply = response(404, "Not Found", "text/plain", "try /metrics or /metrics.json\n");
  }
  std::size_t sent = 0;
  while (sent < reply.size()) {
    const ssize_t n = ::send(client_fd, reply.data() + sent, reply.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<std::size_t>(n);
  }
}

}  // namespace anview::detail
