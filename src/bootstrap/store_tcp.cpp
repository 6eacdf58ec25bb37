// The TCP store: the client (blocking calls with deadlines), and the StoreImpl that serves
// (store_tcp_server.hpp) and connects. Wire format: store_protocol.hpp and
// docs/store-protocol.md.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "anview/error.hpp"
#include "base/clock.hpp"
#include "base/log.hpp"
#include "base/random.hpp"
#include "base/socket.hpp"
#include "base/tls.hpp"
#include "bootstrap/store_impl.hpp"
#include "bootstrap/store_protocol.hpp"
#include "bootstrap/store_tcp_server.hpp"

namespace anview::detail {
namespace {

namespace proto = bootstrap::store_protocol;
using proto::Op;
using proto::Status;

// ---------------------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------------------

// A connection of the client: a blocking-style socket, through TLS with ANVIEW_TLS=1.
struct Channel {
  base::Fd fd;
  std::unique_ptr<base::tls::Session> tls;

  void write_all(const void* data, std::size_t bytes, base::Deadline deadline,
                 const ErrorContext& ctx) {
    if (tls)
      base::tls::write_all(*tls, fd.get(), data, bytes, deadline, ctx);
    else
      base::write_all(fd.get(), data, bytes, deadline, ctx);
  }
  void read_all(void* data, std::size_t bytes, base::Deadline deadline, const ErrorContext& ctx) {
    if (tls)
      base::tls::read_all(*tls, fd.get(), data, bytes, deadline, ctx);
    else
      base::read_all(fd.get(), data, bytes, deadline, ctx);
  }
};

// Blocking calls on connections to one store. A call takes an idle connection (or opens
// one), so concurrent calls from several threads never queue behind a waiting get; a
// single-threaded user holds exactly one connection. A connection whose call failed is
// closed, never reused: its stream may hold a late reply.
class TcpStoreClient {
 public:
  TcpStoreClient(const base::SockAddr& target, std::string shown, int rank,
                 std::chrono::milliseconds connect_timeout)
      : target_(target), shown_(std::move(shown)), rank_(rank) {
    // Made a request (or proved the secret): it may stay idle for the first call.
    release(connect(base::deadline_after(connect_timeout), "store.connect", connect_timeout));
  }

  StoreImpl::Bytes call(Op op, const std::vector<std::string>& keys, const std::uint8_t* payload,
                        std::size_t payload_bytes, std::chrono::milliseconds timeout);

 private:
  ErrorContext context(const std::string& operation) const {
    return {.rank = rank_, .peer_address = shown_, .operation = operation};
  }
  // A connection, through the handshake, tried again while the store cuts handshakes off.
  Channel connect(base::Deadline deadline, const std::string& operation,
                  std::chrono::milliseconds timeout);
  // `authenticating`: set once the connection is made and its handshake (the secret's, or the
  // first request without one) begins.
  Channel connect_once(base::Deadline deadline, const std::string& operation,
                       std::chrono::milliseconds timeout, bool* authenticating);
  // With a job secret: proves it to the server and checks the server's proof (hello, prove).
  void authenticate(Channel& channel, base::Deadline deadline, const std::string& operation);
  // Without one: a request that changes nothing (check), so the connection stops counting as
  // pending at the server before a real request, which could not be sent again, goes out.
  void make_first_request(Channel& channel, base::Deadline deadline, const std::string& operation);
  // Reads a reply's header and body; `op` names the request.
  proto::ReplyHeader read_reply(Channel& channel, Op op, base::Deadline deadline,
                                const ErrorContext& ctx, StoreImpl::Bytes& body) const;
  Channel acquire(base::Deadline deadline, const std::string& operation,
                  std::chrono::milliseconds timeout);
  void release(Channel channel);
  [[noreturn]] void fail(ErrorKind kind, const std::string& operation, std::string cause) const {
    ErrorContext c = context(operation);
    c.cause = std::move(cause);
    throw Error(kind, std::move(c));
  }

  static constexpr std::size_t max_idle = 8;

  const base::SockAddr target_;
  const std::string shown_;
  const int rank_;
  const base::auth::Secret secret_ = base::auth::Secret::from_environment();
  const std::shared_ptr<const base::tls::Context> tls_ =
      base::tls::Context::from_environment(secret_);
  const proto::Limits limits_ = proto::Limits::configured();
  std::mutex mutex_;
  std::vector<Channel> idle_;  // guarded by mutex_
};

Channel TcpStoreClient::connect(base::Deadline deadline, const std::string& operation,
                                std::chrono::milliseconds timeout) {
  // The store drops the oldest connection that has not made a request (or proved the secret)
  // once more than ANVIEW_MAX_PENDING_CONNECTIONS are: a large job's ranks connecting at once.
  // A connection that was made and then lost in its handshake (the secret's hello and prove, or
  // without a secret a first check) is tried again, after a growing, randomized pause (the ranks
  // must not come back in step), until the deadline. The handshake changes nothing in the
  // store, so trying again is safe; any other error (the TCP connect itself, TLS, a refused
  // secret) is final.
  auto pause = std::chrono::milliseconds(2);
  for (int attempt = 1;; ++attempt) {
    bool authenticating = false;
    try {
      return connect_once(deadline, operation, timeout, &authenticating);
    } catch (const Error& e) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - base::Clock::now());
      if (e.kind() != ErrorKind::link || !authenticating || left <= pause) throw;
      base::log("store", base::LogLevel::debug, "rank ", rank_, ": the store at ", shown_,
                " closed the connection during its handshake (attempt ", attempt, ": ", e.cause(),
                "); connecting again");
      std::this_thread::sleep_for(std::min(
          left - pause,
          pause / 2 + std::chrono::milliseconds(base::random_u64() % (pause.count() + 1))));
    }
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
}

Channel TcpStoreClient::connect_once(base::Deadline deadline, const std::string& operation,
                                     std::chrono::milliseconds timeout, bool* authenticating) {
  Channel channel;
  try {
    channel.fd = base::connect_tcp(target_, deadline, context(operation));
  } catch (const Error& e) {
    fail(e.kind(), operation,
         "cannot connect to the store within " + std::to_string(timeout.count()) +
             " ms: " + e.cause());
  }
  if (tls_) {
    base::set_nonblocking(channel.fd.get(), true);
    channel.tls =
        std::make_unique<base::tls::Session>(*tls_, channel.fd.get(), base::tls::Role::client);
    try {
      base::tls::handshake(*channel.tls, channel.fd.get(), deadline, context(operation));
    } catch (const Error& e) {
      fail(e.kind(), operation, "TLS with the store at " + shown_ + ": " + e.cause());
    }
  }
  *authenticating = true;
  if (!secret_.empty()) {
    authenticate(channel, deadline, operation);
  } else {
    make_first_request(channel, deadline, operation);
  }
  return channel;
}

void TcpStoreClient::make_first_request(Channel& channel, base::Deadline deadline,
                                        const std::string& operation) {
  const ErrorContext ctx = context(operation);
  const auto request = proto::encode_request_prefix(Op::check, {"."}, 0);
  channel.write_all(request.data(), request.size(), deadline, ctx);
  StoreImpl::Bytes body;
  const proto::ReplyHeader h = read_reply(channel, Op::check, deadline, ctx, body);
  if (h.status != static_cast<std::uint8_t>(Status::ok))
    fail(ErrorKind::protocol, operation,
         "the store at " + shown_ + " refused a check: " + std::string(body.begin(), body.end()));
}

void TcpStoreClient::authenticate(Channel& channel, base::Deadline deadline,
                                  const std::string& operation) {
  const ErrorContext ctx = context(operation);
  const base::auth::Nonce nonce = base::auth::fresh_nonce();
  auto request = proto::encode_request_prefix(Op::hello, {}, nonce.size());
  request.insert(request.end(), nonce.begin(), nonce.end());
  channel.write_all(request.data(), request.size(), deadline, ctx);
  StoreImpl::Bytes body;
  read_reply(channel, Op::hello, deadline, ctx, body);
  if (body.size() != proto::hello_reply_bytes)
    fail(ErrorKind::protocol, operation,
         "the store's answer to hello has " + std::to_string(body.size()) + " bytes, not " +
             std::to_string(proto::hello_reply_bytes));
  base::auth::Nonce server{};
  std::memcpy(server.data(), body.data(), server.size());
  const auto expected = proto::server_proof(secret_, nonce, server);
  if (!base::auth::same({body.data() + server.size(), expected.size()}, expected))
    fail(ErrorKind::auth, operation,
         "the store at " + shown_ +
             " did not prove the job secret (a different ANVIEW_SECRET there, or not the job's "
             "store)");
  const auto mac = proto::client_proof(secret_, nonce, server);
  request = proto::encode_request_prefix(Op::prove, {}, mac.size());
  request.insert(request.end(), mac.begin(), mac.end());
  channel.write_all(request.data(), request.size(), deadline, ctx);
  read_reply(channel, Op::prove, deadline, ctx, body);
}

proto::ReplyHeader TcpStoreClient::read_reply(Channel& channel, Op op, base::Deadline deadline,
                                              const ErrorContext& ctx,
                                              StoreImpl::Bytes& body) const {
  const std::string& operation = ctx.operation;
  std::uint8_t head[proto::reply_header_bytes];
  channel.read_all(head, sizeof head, deadline, ctx);
  const proto::ReplyHeader h = proto::decode_reply_header(head);
  if (h.magic != proto::magic) {
    char text[16];
    std::snprintf(text, sizeof text, "0x%08x", h.magic);
    fail(ErrorKind::protocol, operation,
         "the peer does not speak the Anview store protocol (reply magic " + std::string(text) +
             ") to " + proto::to_string(op));
  }
  if (h.version != proto::version ||
      h.status == static_cast<std::uint8_t>(Status::version_mismatch))
    fail(ErrorKind::protocol, operation,
         "store at " + shown_ + " speaks version " + std::to_string(h.version) +
             ", this process speaks " + std::to_string(proto::version) +
             " (use the same Anview release on every rank)");
  if (h.status > static_cast<std::uint8_t>(Status::unauthenticated))
    fail(ErrorKind::protocol, operation, "unknown reply status " + std::to_string(h.status));
  const auto status = static_cast<Status>(h.status);
  const std::uint32_t limit = proto::max_reply_body(op, status, limits_);
  if (h.body_bytes > limit)
    fail(ErrorKind::protocol, operation,
         "reply body of " + std::to_string(h.body_bytes) + " bytes to " + proto::to_string(op) +
             " exceeds the limit of " + std::to_string(limit));
  body.resize(h.body_bytes);
  if (!body.empty()) channel.read_all(body.data(), body.size(), deadline, ctx);
  if (status == Status::unauthenticated)
    fail(ErrorKind::auth, operation,
         "store at " + shown_ + " refused " + proto::to_string(op) + ": " +
             std::string(body.begin(), body.end()));
  if (status == Status::bad_request && (op == Op::hello || op == Op::prove))
    fail(ErrorKind::protocol, operation,
         "store at " + shown_ + " rejected " + proto::to_string(op) + ": " +
             std::string(body.begin(), body.end()));
  return h;
}

Channel TcpStoreClient::acquire(base::Deadline deadline, const std::string& operation,
                                std::chrono::milliseconds timeout) {
  {
    const std::lock_guard lock(mutex_);
    if (!idle_.empty()) {
      Channel channel = std::move(idle_.back());
      idle_.pop_back();
      return channel;
    }
  }
  return connect(deadline, operation, timeout);
}

void TcpStoreClient::release(Channel channel) {
  const std::lock_guard lock(mutex_);
  if (idle_.size() < max_idle) idle_.push_back(std::move(channel));
}

StoreImpl::Bytes TcpStoreClient::call(Op op, const std::vector<std::string>& keys,
                                      const std::uint8_t* payload, std::size_t payload_bytes,
                                      std::chrono::milliseconds timeout) {
  const std::string operation = std::string("store.") + proto::to_string(op);
  const auto deadline = base::deadline_after(timeout);
  const std::string about = (keys.size() == 1 ? "key " : "keys ") + describe_keys(keys);
  Channel channel = acquire(deadline, operation, timeout);
  const ErrorContext ctx = context(operation);
  proto::ReplyHeader h;
  StoreImpl::Bytes body;
  try {
    const auto prefix = proto::encode_request_prefix(op, keys, payload_bytes);
    channel.write_all(prefix.data(), prefix.size(), deadline, ctx);
    if (payload_bytes > 0) channel.write_all(payload, payload_bytes, deadline, ctx);
    h = read_reply(channel, op, deadline, ctx, body);
    const std::uint32_t limit = proto::max_reply_body(op, static_cast<Status>(h.status), limits_);
    if (h.status == static_cast<std::uint8_t>(Status::ok) && (op == Op::add || op == Op::check) &&
        h.body_bytes != limit)
      fail(ErrorKind::protocol, operation,
           "reply body of " + std::to_string(h.body_bytes) + " bytes to " + proto::to_string(op) +
               " (expected " + std::to_string(limit) + ")");
  } catch (const Error& e) {
    // `channel` is closed on the way out: after a timeout its stream may still get a late reply.
    if (e.kind() != ErrorKind::timeout && e.kind() != ErrorKind::link) throw;
    if (e.kind() == ErrorKind::timeout) {
      const std::string within = " within " + std::to_string(timeout.count()) + " ms";
      if (op == Op::get) fail(ErrorKind::timeout, operation, about + " was not set" + within);
      if (op == Op::wait)
        fail(ErrorKind::timeout, operation,
             about + (keys.size() == 1 ? " was not set" : " were not all set") + within);
      fail(ErrorKind::timeout, operation,
           "no reply to " + std::string(proto::to_string(op)) + " of " + about + within);
    }
    fail(ErrorKind::link, operation,
         "lost the connection to the store during " + std::string(proto::to_string(op)) + " of " +
             about + ": " + e.cause());
  }
  const auto status = static_cast<Status>(h.status);
  if (status == Status::bad_value) {
    release(std::move(channel));
    fail(ErrorKind::usage, operation, std::string(body.begin(), body.end()));
  }
  if (status == Status::bad_request)
    fail(ErrorKind::protocol, operation,
         "store at " + shown_ + " rejected " + proto::to_string(op) + " of " + about + ": " +
             std::string(body.begin(), body.end()));
  release(std::move(channel));
  return body;
}

// ---------------------------------------------------------------------------------------
// The StoreImpl: a client, plus the server when this process serves the store.
// ---------------------------------------------------------------------------------------

class TcpStore final : public StoreImpl {
 public:
  // Serves at host_port and connects to it.
  TcpStore(std::unique_ptr<TcpStoreServer> server, const StoreOptions& options)
      : StoreImpl(options),
        server_(std::move(server)),
        shown_(server_->bound().to_string()),
        client_(std::make_unique<TcpStoreClient>(reachable(server_->bound()), shown_, options.rank,
                                                 options.timeout)) {}
  // Connects to a store served elsewhere.
  TcpStore(const std::string& host_port, const StoreOptions& options)
      : StoreImpl(options),
        shown_(host_port),
        client_(std::make_unique<TcpStoreClient>(
            base::SockAddr::parse(
                host_port,
                {.rank = options.rank, .peer_address = host_port, .operation = "store.connect"}),
            shown_, options.rank, options.timeout)) {}

  ~TcpStore() override {
    client_.reset();  // close our connections before the server stops
    server_.reset();
  }

  void set(const std::string& key, const std::uint8_t* data, std::size_t size,
           Timeout timeout) override {
    client_->call(Op::set, {key}, data, size, timeout);
  }

  Bytes get(const std::string& key, Timeout timeout) override {
    return client_->call(Op::get, {key}, nullptr, 0, timeout);
  }

  std::int64_t add(const std::string& key, std::int64_t delta, Timeout timeout) override {
    std::uint8_t payload[8];
    proto::put_u64(payload, static_cast<std::uint64_t>(delta));
    const Bytes reply = client_->call(Op::add, {key}, payload, sizeof payload, timeout);
    return static_cast<std::int64_t>(proto::get_u64(reply.data()));
  }

  bool check(const std::vector<std::string>& keys, Timeout timeout) override {
    return client_->call(Op::check, keys, nullptr, 0, timeout).at(0) != 0;
  }

  void wait(const std::vector<std::string>& keys, Timeout timeout) override {
    client_->call(Op::wait, keys, nullptr, 0, timeout);
  }

  std::string address() const override { return shown_; }

 private:
  // Where this process reaches its own server: a wildcard bind is reached over loopback.
  static base::SockAddr reachable(base::SockAddr addr) {
    if (addr.family() == AF_INET) {
      auto* a = reinterpret_cast<sockaddr_in*>(&addr.storage);
      if (a->sin_addr.s_addr == htonl(INADDR_ANY)) a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    } else if (addr.family() == AF_INET6) {
      auto* a = reinterpret_cast<sockaddr_in6*>(&addr.storage);
      if (IN6_IS_ADDR_UNSPECIFIED(&a->sin6_addr)) a->sin6_addr = in6addr_loopback;
    }
    return addr;
  }

  std::unique_ptr<TcpStoreServer> server_;  // null for a client of a remote store
  std::string shown_;
  std::unique_ptr<TcpStoreClient> client_;
};

}  // namespace

std::shared_ptr<StoreImpl> serve_tcp_store(const std::string& host_port,
                                           const StoreOptions& options) {
  auto server = std::make_unique<TcpStoreServer>(host_port, options.rank);
  return std::make_shared<TcpStore>(std::move(server), options);
}

std::shared_ptr<StoreImpl> connect_tcp_store(const std::string& host_port,
                                             const StoreOptions& options) {
  return std::make_shared<TcpStore>(host_port, options);
}

}  // namespace anview::detail
