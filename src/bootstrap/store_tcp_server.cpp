// The TCP store's server: store_tcp_server.hpp.
#include "bootstrap/store_tcp_server.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "anview/error.hpp"
#include "base/log.hpp"
#include "bootstrap/store_impl.hpp"

namespace anview::detail {
namespace {

namespace proto = bootstrap::store_protocol;
using base::LogLevel;
using proto::Op;
using proto::Status;

// How long a connection that broke the protocol may take to read its error reply and close.
constexpr auto closing_grace = std::chrono::seconds(1);
// Input discarded from such a connection before it is closed regardless.
constexpr std::size_t closing_discard_limit = 1 << 20;
// Bytes read from one connection per wake-up, so one fast sender cannot starve the others.
constexpr std::size_t read_budget = 1 << 20;
constexpr std::size_t read_chunk = 256 << 10;
// Buffers above this are released once their frame is done.
constexpr std::size_t keep_buffer_bytes = 1 << 20;

constexpr std::uint64_t listener_token = 0;
constexpr std::uint64_t wake_token = 1;

}  // namespace

TcpStoreServer::TcpStoreServer(const std::string& host_port, int rank) : rank_(rank) {
  const ErrorContext context{.rank = rank, .peer_address = host_port, .operation = "store.serve"};
  bound_ = base::SockAddr::parse(host_port, context);
  listener_ = base::listen_tcp(bound_, 1024, context);
  bound_ = base::local_address(listener_.get());
  name_ = "store server on " + bound_.to_string();
  wake_ = base::Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake_.valid()) throw base::sys_error(ErrorKind::internal, context, "eventfd()", errno);
  epoll_ = base::Fd(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_.valid())
    throw base::sys_error(ErrorKind::internal, context, "epoll_create1()", errno);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = listener_token;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listener_.get(), &ev) != 0)
    throw base::sys_error(ErrorKind::internal, context, "epoll_ctl()", errno);
  ev.data.u64 = wake_token;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev) != 0)
    throw base::sys_error(ErrorKind::internal, context, "epoll_ctl()", errno);
  thread_ = std::thread([this] { run(); });
  base::log("store", LogLevel::info, "store server listening on ", bound_.to_string());
  const std::string host = bound_.host();
  if (tls_) base::log("store", LogLevel::info, name_, ": ", tls_->describe());
  if (secret_.empty() && !tls_ && host.rfind("127.", 0) != 0 && host != "::1") {
    base::log("store", LogLevel::warn, name_,
              " has no job secret: any process that reaches it can read and write the job's "
              "keys. Set ANVIEW_SECRET on every rank (anview-run does it for each job); see "
              "SECURITY.md");
  }
}

TcpStoreServer::~TcpStoreServer() {
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_.get(), &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  base::log("store", LogLevel::info, name_, " stopped");
}

void TcpStoreServer::run() noexcept {
  try {
    loop();
  } catch (const std::exception& e) {
    base::log("store", LogLevel::error, name_,
              " stopped serving after an unexpected failure: ", e.what());
  }
  conns_.clear();
}

void TcpStoreServer::loop() {
  epoll_event events[64];
  for (;;) {
    const int n = ::epoll_wait(epoll_.get(), events, 64, next_timeout());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw base::sys_error(ErrorKind::internal, {.rank = rank_, .operation = "store.serve"},
                            "epoll_wait()", errno);
    for (int i = 0; i < n; ++i) {
      const std::uint64_t token = events[i].data.u64;
      if (token == wake_token) return;
      if (token == listener_token) {
        // A connection that cannot be set up (out of memory, a TLS session refused) is lost
        // alone: the server goes on serving, and accepting (the listener stays readable).
        try {
          accept_all();
        } catch (const std::exception& e) {
          base::log("store", LogLevel::warn, name_,
                    ": dropped a connection it could not set up: ", e.what());
        }
        continue;
      }
      // The connection may have been dropped by an earlier event of this batch.
      const auto it = conns_.find(token);
      if (it == conns_.end()) continue;
      try {
        handle(*it->second, events[i].events);
      } catch (const std::exception& e) {  // out of memory, most likely: lose one client only
        const auto again = conns_.find(token);
        if (again == conns_.end()) continue;
        drop_logged(*again->second, e.what());
      }
    }
    // TLS connections with a request in OpenSSL's buffer: epoll does not wake for it.
    std::vector<std::uint64_t> ready;
    ready.swap(tls_ready_);
    for (const std::uint64_t id : ready) {
      const auto it = conns_.find(id);
      if (it == conns_.end()) continue;
      try {
        handle(*it->second, EPOLLIN);
      } catch (const std::exception& e) {
        const auto again = conns_.find(id);
        if (again != conns_.end()) drop_logged(*again->second, e.what());
      }
    }
    // Connections that broke the protocol and did not close within their grace period.
    const auto now = base::Clock::now();
    for (std::size_t i = 0; i < closing_.size();) {
      const auto it = conns_.find(closing_[i]);
      if (it == conns_.end()) {
        closing_[i] = closing_.back();
        closing_.pop_back();
      } else if (it->second->closing_by <= now) {
        drop(*it->second);  // erases it from closing_ too
      } else {
        ++i;
      }
    }
    expire_pending();
  }
}

void TcpStoreServer::expire_pending() {
  const auto now = base::Clock::now();
  while (!pending_.empty()) {
    const auto it = conns_.find(pending_.front());
    if (it == conns_.end()) {
      pending_.pop_front();
      continue;
    }
    if (it->second->pending_until > now) return;
    drop_logged(*it->second, "no request within " + std::to_string(handshake_timeout_.count()) +
                                 " ms of connecting (ANVIEW_HANDSHAKE_TIMEOUT)");
  }
}

int TcpStoreServer::next_timeout() {
  base::Deadline first = base::Deadline::max();
  for (const std::uint64_t id : closing_) {
    const auto it = conns_.find(id);
    if (it != conns_.end()) first = std::min(first, it->second->closing_by);
  }
  if (!pending_.empty()) {
    const auto it = conns_.find(pending_.front());
    first = it == conns_.end() ? base::Clock::now() : std::min(first, it->second->pending_until);
  }
  if (!tls_ready_.empty()) return 0;
  if (first == base::Deadline::max()) return closing_.empty() ? -1 : 0;
  return base::ms_left(first);
}

void TcpStoreServer::end_pending(Conn& c) {
  if (!c.pending) return;
  c.pending = false;
  std::erase(pending_, c.id);
}

void TcpStoreServer::accept_all() {
  for (;;) {
    const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if ((errno == EMFILE || errno == ENFILE) && !pending_.empty()) {
        // The pending connections hold the descriptors: the oldest gives way.
        const auto oldest = conns_.find(pending_.front());
        if (oldest == conns_.end()) {
          pending_.pop_front();
        } else {
          drop_logged(*oldest->second,
                      "out of file descriptors; the oldest connection that "
                      "made no request yet gives way");
        }
        continue;
      }
      if (!accept_failure_logged_)
        base::log("store", LogLevel::warn, name_,
                  ": cannot accept a connection: ", base::errno_text(errno));
      accept_failure_logged_ = true;
      // Out of descriptors: give the clients time to close some instead of spinning.
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return;
    }
    base::Fd accepted(fd);  // closed if what follows throws
    auto conn = std::make_unique<Conn>();
    conn->id = next_id_++;
    conn->fd = std::move(accepted);
    conn->peer = base::remote_address(fd).to_string();
    conn->authenticated = secret_.empty();
    if (tls_) conn->tls = std::make_unique<base::tls::Session>(*tls_, fd, base::tls::Role::server);
    base::set_nodelay(fd);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = conn->id;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      base::log("store", LogLevel::warn, name_, ": epoll_ctl for ", conn->peer,
                " failed: ", base::errno_text(errno));
      continue;
    }
    conn->events = EPOLLIN;
    conn->pending_until = base::deadline_after(handshake_timeout_);
    base::log("store", LogLevel::debug, name_, ": connection from ", conn->peer);
    const std::uint64_t id = conn->id;
    conns_.emplace(id, std::move(conn));
    pending_.push_back(id);
    // Against a flood or idle connections (slow-loris): the oldest pending one gives way. It
    // gets one read first: a client whose request already arrived (its connection accepted
    // just before a flood) is served, not dropped.
    while (pending_.size() > max_pending_) {
      const std::uint64_t oldest = pending_.front();
      auto it = conns_.find(oldest);
      if (it == conns_.end()) {
        pending_.pop_front();
        continue;
      }
      if (!it->second->closing && it->second->out.empty()) {
        try {
          handle(*it->second, EPOLLIN);  // may serve it, or drop it
        } catch (const std::exception& e) {
          if ((it = conns_.find(oldest)) != conns_.end()) drop_logged(*it->second, e.what());
          continue;
        }
        it = conns_.find(oldest);
        if (it == conns_.end() || !it->second->pending) continue;
      }
      drop_logged(*it->second, std::to_string(max_pending_) +
                                   " connections have not made a request yet "
                                   "(ANVIEW_MAX_PENDING_CONNECTIONS); the oldest gives way");
    }
  }
}

void TcpStoreServer::handle(Conn& c, std::uint32_t events) {
  if (events & EPOLLERR) {
    base::log("store", LogLevel::debug, name_, ": socket error on connection from ", c.peer);
    drop(c);
    return;
  }
  if (c.tls && !c.tls->established()) {
    if (!secure(c) || !c.tls->established()) return;
    events |= EPOLLIN;  // a request may have come with the handshake's last record
  }
  if (!c.out.empty() && (events & (EPOLLOUT | EPOLLHUP))) {
    if (!flush(c)) return;
  }
  if (c.closing) {
    if (c.out.empty() && (events & (EPOLLIN | EPOLLHUP | EPOLLRDHUP))) discard_input(c);
    return;
  }
  if (c.parked) {
    // The client gave up (its deadline passed) or went away.
    if (events & (EPOLLRDHUP | EPOLLHUP)) {
      base::log("store", LogLevel::debug, name_, ": ", c.peer, " closed while waiting for '",
                c.parked_on, "'");
      drop(c);
    }
    return;
  }
  if (c.out.empty() && (events & (EPOLLIN | EPOLLHUP | EPOLLRDHUP))) read_frames(c);
}

bool TcpStoreServer::secure(Conn& c) {
  switch (c.tls->handshake()) {
    case base::tls::Session::Step::done:
      return true;
    case base::tls::Session::Step::want_read:
    case base::tls::Session::Step::want_write:
      update_interest(c);
      return true;
    case base::tls::Session::Step::failed:
      break;
  }
  std::uint8_t head[4];
  if (c.tls->plaintext_peer() &&
      ::recv(c.fd.get(), head, sizeof head, MSG_PEEK | MSG_DONTWAIT) == sizeof head &&
      proto::get_u32(head) == proto::magic) {
    // A store client without TLS: answered in plain text, so its error names the cause,
    // then closed as any rejected client is.
    c.tls.reset();
    reject(c, Status::bad_request,
           "this store requires TLS (ANVIEW_TLS=1 here, not on the client: set it on every "
           "rank, or on none)");
    return false;
  }
  drop_logged(c, c.tls->failure());
  return false;
}

ssize_t TcpStoreServer::receive(Conn& c, void* data, std::size_t bytes) {
  return c.tls ? c.tls->read(data, bytes) : ::recv(c.fd.get(), data, bytes, MSG_DONTWAIT);
}

ssize_t TcpStoreServer::transmit(Conn& c, const void* data, std::size_t bytes) {
  return c.tls ? c.tls->write(data, bytes)
               : ::send(c.fd.get(), data, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
}

void TcpStoreServer::read_frames(Conn& c) {
  std::size_t budget = read_budget;
  // Through TLS, what OpenSSL holds is read past the budget (at most its read-ahead buffer):
  // epoll would not wake for it.
  while (!c.parked && c.out.empty() && !c.closing && (budget > 0 || (c.tls && c.tls->buffered()))) {
    const std::size_t need =
        proto::request_header_bytes + (c.have_header ? c.header.body_bytes : 0);
    const std::size_t have = c.in.size();
    const std::size_t want = std::min({need - have, read_chunk, budget > 0 ? budget : read_chunk});
    c.in.resize(have + want);
    const ssize_t n = receive(c, c.in.data() + have, want);
    if (n < 0) {
      const int err = errno;
      c.in.resize(have);
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) break;
      if (err == EPROTO && c.tls) {
        drop_logged(c, c.tls->failure());
        return;
      }
      base::log("store", LogLevel::debug, name_, ": recv from ", c.peer, ": ",
                base::errno_text(err));
      drop(c);
      return;
    }
    c.in.resize(have + static_cast<std::size_t>(n));
    if (n == 0) {
      if (have == 0) {
        base::log("store", LogLevel::debug, name_, ": ", c.peer, " closed its connection");
      } else {
        drop_logged(c, "truncated frame, the peer closed after " + std::to_string(have) + " of " +
                           std::to_string(c.have_header ? need : proto::request_header_bytes) +
                           (c.have_header ? " bytes" : " header bytes"));
        return;
      }
      drop(c);
      return;
    }
    budget -= std::min(budget, static_cast<std::size_t>(n));
    if (c.in.size() < need) continue;
    if (!c.have_header) {
      c.header = proto::decode_request_header(c.in.data());
      if (c.header.magic != proto::magic) {
        char text[16];
        std::snprintf(text, sizeof text, "0x%08x", c.header.magic);
        drop_logged(c, base::tls::looks_like_tls(c.in.data(), c.in.size())
                           ? std::string("the client speaks TLS (ANVIEW_TLS=1 there, not here: "
                                         "set it on every rank, or on none)")
                           : std::string("not an Anview store client (magic ") + text +
                                 ", expected 0x54535641 'AVST')");
        return;
      }
      if (c.header.version != proto::version) {
        reject(c, Status::version_mismatch,
               "this store speaks protocol version " + std::to_string(proto::version) +
                   ", the request is version " + std::to_string(c.header.version));
        return;
      }
      if (auto wrong = proto::check_request_header(c.header, limits_)) {
        reject(c, Status::bad_request, *wrong);
        return;
      }
      // Before the job secret is proven only the handshake's own requests (a few bytes each)
      // are read: any other is refused on its header, so a client without the secret cannot
      // make the store hold a large body.
      const auto op = static_cast<Op>(c.header.op);
      if (!c.authenticated && op != Op::hello && op != Op::prove) {
        refuse_unproven(c, op);
        return;
      }
      c.have_header = true;
      continue;
    }
    const std::uint64_t id = c.id;
    process(c);
    if (!conns_.contains(id)) return;  // the reply failed and dropped the connection
  }
  update_interest(c);
}

void TcpStoreServer::process(Conn& c) {
  proto::Request request;
  if (auto wrong = proto::decode_request_body(c.header, c.in.data() + proto::request_header_bytes,
                                              limits_, request)) {
    reject(c, Status::bad_request, *wrong);
    return;
  }
  c.have_header = false;
  execute(c, request);  // may drop c
}

const std::string* TcpStoreServer::missing_key(const std::vector<std::string>& keys) const {
  for (const auto& k : keys)
    if (!data_.contains(k)) return &k;
  return nullptr;
}

void TcpStoreServer::execute(Conn& c, proto::Request& request) {
  // The request's payload points into c.in: use it before c.in is released.
  const auto release_input = [&c] {
    if (c.in.capacity() > keep_buffer_bytes) std::vector<std::uint8_t>().swap(c.in);
    c.in.clear();
  };
  if (!c.authenticated || request.op == Op::hello || request.op == Op::prove) {
    authenticate(c, request);
    return;
  }
  end_pending(c);
  const std::string& key = request.keys.front();
  switch (request.op) {
    case Op::hello:
    case Op::prove:
      return;  // authenticate()'s
    case Op::set: {
      auto& value = data_[key];
      value.assign(request.payload.begin(), request.payload.end());
      release_input();
      reply(c, Status::ok, nullptr, 0);  // may drop c; `request` stays valid
      notify(key);
      return;
    }
    case Op::get: {
      release_input();
      const auto it = data_.find(key);
      if (it == data_.end()) {
        const std::string missing = key;
        park(c, Op::get, std::move(request.keys), missing);
      } else {
        reply(c, Status::ok, it->second.data(), it->second.size());
      }
      return;
    }
    case Op::add: {
      const auto delta = static_cast<std::int64_t>(
          proto::get_u64(reinterpret_cast<const std::uint8_t*>(request.payload.data())));
      release_input();
      std::int64_t current = 0;
      const auto it = data_.find(key);
      if (it != data_.end() &&
          !parse_counter(
              std::string_view(reinterpret_cast<const char*>(it->second.data()), it->second.size()),
              current)) {
        const std::string why = "the value of key '" + key + "' is not an integer";
        reply(c, Status::bad_value, why.data(), why.size());
        return;
      }
      std::int64_t result = 0;
      if (__builtin_add_overflow(current, delta, &result)) {
        const std::string why = "adding " + std::to_string(delta) + " to key '" + key + "' (" +
                                std::to_string(current) + ") overflows int64";
        reply(c, Status::bad_value, why.data(), why.size());
        return;
      }
      const std::string text = std::to_string(result);
      data_[key].assign(text.begin(), text.end());
      std::uint8_t body[8];
      proto::put_u64(body, static_cast<std::uint64_t>(result));
      reply(c, Status::ok, body, sizeof body);
      notify(key);
      return;
    }
    case Op::check: {
      release_input();
      const std::uint8_t all = missing_key(request.keys) == nullptr ? 1 : 0;
      reply(c, Status::ok, &all, 1);
      return;
    }
    case Op::wait: {
      release_input();
      if (const std::string* missing = missing_key(request.keys)) {
        const std::string first = *missing;
        park(c, Op::wait, std::move(request.keys), first);
      } else {
        reply(c, Status::ok, nullptr, 0);
      }
      return;
    }
  }
}

void TcpStoreServer::authenticate(Conn& c, const proto::Request& request) {
  const auto* payload = reinterpret_cast<const std::uint8_t*>(request.payload.data());
  if (secret_.empty()) {
    refuse_auth(c,
                "this store has no job secret and the client has one (set the same "
                "ANVIEW_SECRET on every rank, or on none)");
    return;
  }
  switch (request.op) {
    case Op::hello: {
      if (c.challenged) {
        reject(c, Status::bad_request, "a second hello on one connection");
        return;
      }
      std::memcpy(c.client_nonce.data(), payload, c.client_nonce.size());
      c.server_nonce = base::auth::fresh_nonce();
      c.challenged = true;
      const auto mac = proto::server_proof(secret_, c.client_nonce, c.server_nonce);
      std::uint8_t body[proto::hello_reply_bytes];
      std::memcpy(body, c.server_nonce.data(), c.server_nonce.size());
      std::memcpy(body + c.server_nonce.size(), mac.data(), mac.size());
      c.in.clear();
      reply(c, Status::ok, body, sizeof body);
      return;
    }
    case Op::prove: {
      if (!c.challenged || c.authenticated) {
        refuse_auth(c, "a proof without a hello before it");
        return;
      }
      const auto expected = proto::client_proof(secret_, c.client_nonce, c.server_nonce);
      if (!base::auth::same({payload, expected.size()}, expected)) {
        refuse_auth(c,
                    "wrong proof of the job secret (a different ANVIEW_SECRET, or a replayed "
                    "handshake)");
        return;
      }
      c.authenticated = true;
      end_pending(c);
      c.in.clear();
      reply(c, Status::ok, nullptr, 0);
      return;
    }
    default:
      refuse_unproven(c, request.op);
  }
}

void TcpStoreServer::refuse_unproven(Conn& c, Op op) {
  refuse_auth(c, std::string("this store requires the job secret (ANVIEW_SECRET) and the client "
                             "sent ") +
                     proto::to_string(op) +
                     " with no proof of it: set the same ANVIEW_SECRET on every rank");
}

void TcpStoreServer::refuse_auth(Conn& c, const std::string& why) {
  std::string host;
  if (auth_failures_.first(c.peer, &host)) {
    base::log("store", LogLevel::warn, name_, ": authentication failed for ", c.peer, ": ", why,
              " (further failures from ", host, " are not logged)");
  }
  reject(c, Status::unauthenticated, why, /*logged=*/true);
}

void TcpStoreServer::park(Conn& c, Op op, std::vector<std::string> keys,
                          const std::string& missing) {
  c.parked = true;
  c.parked_op = op;
  c.parked_keys = std::move(keys);
  c.parked_on = missing;
  waiters_[missing].push_back(c.id);
  update_interest(c);
}

void TcpStoreServer::resume(Conn& c) {
  if (const std::string* missing = missing_key(c.parked_keys)) {
    c.parked_on = *missing;
    waiters_[*missing].push_back(c.id);
    return;
  }
  c.parked = false;
  c.parked_on.clear();
  const Op op = c.parked_op;
  const std::string key = c.parked_keys.front();
  c.parked_keys.clear();
  if (op == Op::get) {
    const auto& value = data_.at(key);
    reply(c, Status::ok, value.data(), value.size());
  } else {
    reply(c, Status::ok, nullptr, 0);
  }
}

void TcpStoreServer::notify(const std::string& key) {
  const auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  const std::vector<std::uint64_t> ids = std::move(it->second);
  waiters_.erase(it);
  for (const std::uint64_t id : ids) {
    const auto c = conns_.find(id);
    if (c != conns_.end() && c->second->parked && c->second->parked_on == key) resume(*c->second);
  }
}

void TcpStoreServer::reply(Conn& c, Status status, const void* body, std::size_t bytes) {
  proto::ReplyHeader h;
  h.status = static_cast<std::uint8_t>(status);
  h.body_bytes = static_cast<std::uint32_t>(bytes);
  c.out.resize(proto::reply_header_bytes + bytes);
  proto::encode(h, c.out.data());
  if (bytes > 0) std::memcpy(c.out.data() + proto::reply_header_bytes, body, bytes);
  c.out_sent = 0;
  flush(c);
}

void TcpStoreServer::reject(Conn& c, Status status, const std::string& why, bool logged) {
  // Logged once, here; the connection then only flushes the reply and closes.
  if (!logged) drops_.log("store", name_ + ": dropping connection from " + c.peer + ": " + why);
  end_pending(c);  // no longer pending: closing, within closing_grace
  c.closing = true;
  c.closing_by = base::Clock::now() + closing_grace;
  closing_.push_back(c.id);
  std::vector<std::uint8_t>().swap(c.in);
  c.have_header = false;
  const std::string text = why.substr(0, proto::max_error_text_bytes);
  reply(c, status, text.data(), text.size());
}

bool TcpStoreServer::flush(Conn& c) {
  while (c.out_sent < c.out.size()) {
    const ssize_t n = transmit(c, c.out.data() + c.out_sent, c.out.size() - c.out_sent);
    if (n > 0) {
      c.out_sent += static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    } else {
      base::log("store", LogLevel::debug, name_, ": send to ", c.peer, ": ",
                base::errno_text(errno));
      drop(c);
      return false;
    }
  }
  if (c.out_sent == c.out.size()) {
    if (c.out.capacity() > keep_buffer_bytes) std::vector<std::uint8_t>().swap(c.out);
    c.out.clear();
    c.out_sent = 0;
    // The error reply is out: tell the peer we are done, then wait for its close.
    if (c.closing) {
      if (c.tls) c.tls->close_notify();
      ::shutdown(c.fd.get(), SHUT_WR);
    } else if (c.tls && c.tls->buffered() && !c.parked) {
      tls_ready_.push_back(c.id);  // the next request may be in OpenSSL's buffer already
    }
  }
  update_interest(c);
  return true;
}

void TcpStoreServer::discard_input(Conn& c) {
  char sink[16384];
  for (;;) {
    const ssize_t n = receive(c, sink, sizeof sink);
    if (n > 0) {
      c.discarded += static_cast<std::size_t>(n);
      if (c.discarded > closing_discard_limit) break;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    break;  // closed by the peer, or an error
  }
  drop(c);
}

void TcpStoreServer::update_interest(Conn& c) {
  std::uint32_t want = 0;
  if (c.tls && !c.tls->established())
    want = c.tls->wants_write() ? EPOLLOUT : EPOLLIN;
  else if (!c.out.empty())
    want = EPOLLOUT;
  else if (c.parked)
    want = EPOLLRDHUP;
  else
    want = EPOLLIN;
  if (want == c.events) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = c.id;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev) == 0) c.events = want;
}

void TcpStoreServer::drop_logged(Conn& c, const std::string& why) {
  drops_.log("store", name_ + ": dropping connection from " + c.peer + ": " + why);
  drop(c);
}

void TcpStoreServer::drop(Conn& c) {
  if (c.parked) {
    const auto it = waiters_.find(c.parked_on);
    if (it != waiters_.end()) {
      std::erase(it->second, c.id);
      if (it->second.empty()) waiters_.erase(it);
    }
  }
  if (c.closing) std::erase(closing_, c.id);
  if (c.pending) std::erase(pending_, c.id);
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
  conns_.erase(c.id);  // closes the socket; `c` is gone
}

}  // namespace anview::detail
