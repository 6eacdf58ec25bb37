#include "core/dump_service.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

#include "base/config.hpp"
#include "base/log.hpp"

#ifndef ANVIEW_VERSION
#define ANVIEW_VERSION "unknown"
#endif

namespace anview::detail {
namespace {

const base::Setting dump_dir_setting(
    "core", "ANVIEW_DUMP_DIR", "/tmp",
    "Where flight recorder dumps go (anview-dump-<pid>.json), written after errors, stalls "
    "and SIGUSR1");

// The write end of the service's wake pipe while it runs, for the signal handler.
std::atomic<int> g_signal_fd{-1};
static_assert(std::atomic<int>::is_always_lock_free);

constexpr char wake_signal = 'u';
constexpr char wake_stop = 's';

extern "C" void on_sigusr1(int) {
  const int saved = errno;
  if (const int fd = g_signal_fd.load(std::memory_order_relaxed); fd >= 0) {
    [[maybe_unused]] ssize_t n = ::write(fd, &wake_signal, 1);
  }
  errno = saved;
}

// Installs the handler once, where the program left SIGUSR1 at its default (which would kill
// the process): a program with its own handler keeps it.
void install_signal_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old {};
    if (::sigaction(SIGUSR1, nullptr, &old) != 0) return;
    if ((old.sa_flags & SA_SIGINFO) != 0 || old.sa_handler != SIG_DFL) {
      base::log("recorder", base::LogLevel::debug,
                "flight recorder: the program handles SIGUSR1 itself; dump with anview-info "
                "--dump instead");
      return;
    }
    struct sigaction sa {};
    sa.sa_handler = on_sigusr1;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGUSR1, &sa, nullptr);
  });
}

std::string socket_name(pid_t pid) {
  return "anview-dump-" + std::to_string(pid);
}

// An abstract unix socket address: no file to clean up, gone with the process.
socklen_t abstract_address(const std::string& name, sockaddr_un& addr) {
  addr = {};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

std::string iso_time_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  return buf;
}

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

}  // namespace

DumpService& DumpService::instance() {
  // Never destroyed: a communicator leaked until exit may still be registered then.
  static DumpService* service = new DumpService();
  return *service;
}

std::uint64_t DumpService::add(Source source) {
  std::lock_guard life(lifecycle_mu_);
  std::uint64_t id;
  bool first;
  {
    std::lock_guard lock(mu_);
    id = next_id_++;
    sources_.emplace(id, std::move(source));
    first = sources_.size() == 1;
  }
  if (first) start();
  return id;
}

void DumpService::remove(std::uint64_t id) {
  std::lock_guard life(lifecycle_mu_);
  bool last;
  {
    std::lock_guard dumping(dump_mu_);  // a dump in progress may be calling the source
    std::lock_guard lock(mu_);
    sources_.erase(id);
    last = sources_.empty();
  }
  if (last) stop();
}

void DumpService::start() {
  install_signal_handler();
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    base::log("recorder", base::LogLevel::warn,
              "flight recorder: no dump service (pipe2: ", std::strerror(errno), ")");
    return;
  }
  wake_read_.reset(pipe_fds[0]);
  wake_write_.reset(pipe_fds[1]);
  listen_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr;
  const socklen_t len = abstract_address(socket_name(::getpid()), addr);
  if (!listen_.valid() || ::bind(listen_.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(listen_.get(), 8) != 0) {
    base::log("recorder", base::LogLevel::debug, "flight recorder: no dump socket (",
              std::strerror(errno), "); SIGUSR1 still dumps");
    listen_.reset();
  }
  g_signal_fd.store(wake_write_.get(), std::memory_order_relaxed);
  thread_ =
      std::thread([this, wake = wake_read_.get(), listen = listen_.get()] { serve(wake, listen); });
}

void DumpService::stop() {
  if (!thread_.joinable()) return;
  g_signal_fd.store(-1, std::memory_order_relaxed);
  [[maybe_unused]] ssize_t n = ::write(wake_write_.get(), &wake_stop, 1);
  thread_.join();  // it may be dumping: that takes dump_mu_ and mu_, never lifecycle_mu_
  wake_read_.reset();
  wake_write_.reset();
  listen_.reset();
}

void DumpService::serve(int wake_fd, int listen_fd) {
  for (;;) {
    pollfd fds[2] = {{wake_fd, POLLIN, 0}, {listen_fd, POLLIN, 0}};
    const int n = ::poll(fds, listen_fd >= 0 ? 2 : 1, -1);
    if (n < 0 && errno != EINTR) return;
    if (n <= 0) continue;
    if ((fds[0].revents & (POLLERR | POLLHUP | POLLNVAL)) != 0) return;
    if ((fds[0].revents & POLLIN) != 0) {
      char buf[64];
      const ssize_t got = ::read(wake_fd, buf, sizeof buf);
      bool signalled = false;
      for (ssize_t i = 0; i < got; ++i) {
        if (buf[i] == wake_stop) return;
        signalled = signalled || buf[i] == wake_signal;
      }
      if (signalled) write("SIGUSR1");
    }
    if (listen_fd >= 0 && (fds[1].revents & POLLIN) != 0) {
      base::Fd client(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
      if (client.valid())
        answer(client.get());
      else if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // no busy loop meanwhile
    }
  }
}

void DumpService::answer(int client_fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(client_fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
      (cred.uid != ::getuid() && cred.uid != 0)) {
    base::log("recorder", base::LogLevel::warn, "flight recorder: refused a dump request from uid ",
              cred.uid, " (only uid ", ::getuid(), " or root may ask)");
    return;
  }
  const timeval timeout{2, 0};
  ::setsockopt(client_fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  const std::string text = snapshot("anview-info --dump").dump();
  std::size_t sent = 0;
  while (sent < text.size()) {
    const ssize_t n = ::send(client_fd, text.data() + sent, text.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;  // the requester went away or stopped reading: its loss
    sent += static_cast<std::size_t>(n);
  }
}

nlohmann::ordered_json DumpService::snapshot(const std::string& reason) {
  nlohmann::ordered_json out{{"anview_version", ANVIEW_VERSION},
                             {"pid", ::getpid()},
                             {"host", hostname()},
                             {"time", iso_time_now()},
                             {"reason", reason}};
  auto comms = nlohmann::ordered_json::array();
  std::lock_guard dumping(dump_mu_);
  std::vector<Source*> sources;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, source] : sources_) sources.push_back(&source);
  }
  // Sources stay while dump_mu_ is held (remove() takes it).
  for (Source* source : sources) {
    try {
      comms.push_back((*source)());
    } catch (const std::exception& e) {
      comms.push_back({{"error", e.what()}});
    }
  }
  out["communicators"] = std::move(comms);
  return out;
}

std::string DumpService::path_for(pid_t pid) {
  return dump_dir_setting.value() + "/anview-dump-" + std::to_string(pid) + ".json";
}

std::string DumpService::write(const std::string& reason) noexcept {
  try {
    const std::string path = path_for(::getpid());
    const std::string partial = path + ".partial";
    {
      std::ofstream out(partial, std::ios::trunc);
      out << snapshot(reason).dump(1) << '\n';
      if (!out.flush()) throw std::runtime_error("cannot write " + partial);
    }
    if (std::rename(partial.c_str(), path.c_str()) != 0)
      throw std::runtime_error("cannot rename " + partial + ": " + std::strerror(errno));
    base::log("recorder", base::LogLevel::warn, "flight recorder written to ", path, " (", reason,
              ")");
    return path;
  } catch (const std::exception& e) {
    base::log("recorder", base::LogLevel::warn, "flight recorder: no dump (", reason,
              "): ", e.what(), "; ANVIEW_DUMP_DIR sets the directory");
    return {};
  }
}

void DumpService::write_after_error(const std::string& what) noexcept {
  {
    std::lock_guard lock(mu_);
    const auto now = base::Clock::now();
    if (last_error_dump_ != base::Clock::time_point{} &&
        now - last_error_dump_ < std::chrono::seconds(1))
      return;
    last_error_dump_ = now;
  }
  write("after an error: " + what);
}

std::vector<pid_t> DumpService::listening_pids() {
  // Abstract sockets show in /proc/net/unix with '@' for the leading NUL.
  std::vector<pid_t> pids;
  std::ifstream in("/proc/net/unix");
  std::string line;
  const std::string marker = "@anview-dump-";
  while (std::getline(in, line)) {
    const auto at = line.find(marker);
    if (at == std::string::npos) continue;
    try {
      const pid_t pid = std::stoi(line.substr(at + marker.size()));
      if (std::find(pids.begin(), pids.end(), pid) == pids.end()) pids.push_back(pid);
    } catch (const std::exception&) {
    }
  }
  std::sort(pids.begin(), pids.end());
  return pids;
}

nlohmann::ordered_json DumpService::request(pid_t pid, std::chrono::milliseconds timeout) {
  const auto fail = [&](const std::string& cause) {
    return Error(ErrorKind::link,
                 {.operation = "dump request to pid " + std::to_string(pid), .cause = cause});
  };
  base::Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) throw fail(std::string("socket: ") + std::strerror(errno));
  const timeval tv{static_cast<time_t>(timeout.count() / 1000),
                   static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_un addr;
  const socklen_t len = abstract_address(socket_name(pid), addr);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    throw fail(std::string("connect: ") + std::strerror(errno) +
               " (no Anview communicator lives in that process, or it is in another network "
               "namespace)");
  }
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::recv(fd.get(), buf, sizeof buf, 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      throw fail(errno == EAGAIN ? "no answer within " + std::to_string(timeout.count()) + " ms"
                                 : std::string("recv: ") + std::strerror(errno));
    }
    text.append(buf, static_cast<std::size_t>(n));
  }
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::ordered_json::exception& e) {
    throw fail("the answer is not JSON: " + std::string(e.what()));
  }
}

}  // namespace anview::detail
