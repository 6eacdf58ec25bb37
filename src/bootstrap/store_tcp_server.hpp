// The TCP store's server (store_tcp.cpp has the client): one background thread serving every
// connection over epoll and non-blocking sockets. Wire format: store_protocol.hpp and
// docs/store-protocol.md. Private to bootstrap/.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/auth.hpp"
#include "base/clock.hpp"
#include "base/limits.hpp"
#include "base/socket.hpp"
#include "base/tls.hpp"
#include "bootstrap/store_protocol.hpp"

namespace anview::detail {

// Serves one store from a background thread. Every client connection is non-blocking; a
// get or wait whose keys are missing parks its connection until a set or add provides them
// (the client's deadline bounds the wait: it closes the connection when it gives up).
// Construction and destruction happen on the owner's thread; everything else on the
// server thread.
class TcpStoreServer {
  using Op = bootstrap::store_protocol::Op;
  using Status = bootstrap::store_protocol::Status;

 public:
  TcpStoreServer(const std::string& host_port, int rank);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  const base::SockAddr& bound() const { return bound_; }

 private:
  struct Conn {
    std::uint64_t id = 0;
    base::Fd fd;
    std::string peer;
    std::uint32_t events = 0;  // the epoll interest now registered
    // The frame being read: header, then header + body.
    std::vector<std::uint8_t> in;
    bootstrap::store_protocol::RequestHeader header;
    bool have_header = false;
    // The reply being written.
    std::vector<std::uint8_t> out;
    std::size_t out_sent = 0;
    // A get or wait waiting for keys; parked_on is the first key still missing.
    bool parked = false;
    Op parked_op{};
    std::vector<std::string> parked_keys;
    std::string parked_on;
    // After a protocol violation: flush the error reply, then discard input until the peer
    // closes or closing_by passes.
    bool closing = false;
    base::Deadline closing_by{};
    std::size_t discarded = 0;
    // A store with a job secret serves a connection only once it proved it (hello, prove).
    bool authenticated = false;
    bool challenged = false;  // our nonce and proof went out in the hello's reply
    // Until its first valid request (with a secret: its proof) a connection is pending: it
    // must get there within ANVIEW_HANDSHAKE_TIMEOUT, and the oldest pending one gives way
    // when more than ANVIEW_MAX_PENDING_CONNECTIONS are.
    bool pending = true;
    base::Deadline pending_until{};
    base::auth::Nonce client_nonce{}, server_nonce{};
    // With ANVIEW_TLS=1: the TLS session, handshaking until established().
    std::unique_ptr<base::tls::Session> tls;
  };

  void run() noexcept;
  void loop();
  void accept_all();
  void handle(Conn& c, std::uint32_t events);
  void read_frames(Conn& c);
  // Drives a TLS handshake; false when the connection was dropped or rejected.
  bool secure(Conn& c);
  // recv and send on the socket, or through the connection's TLS session.
  static ssize_t receive(Conn& c, void* data, std::size_t bytes);
  static ssize_t transmit(Conn& c, const void* data, std::size_t bytes);
  void process(Conn& c);
  void execute(Conn& c, bootstrap::store_protocol::Request& request);
  void reply(Conn& c, Status status, const void* body, std::size_t bytes);
  // Replies with an error, then closes; logs `why` unless `logged` (said already).
  void reject(Conn& c, Status status, const std::string& why, bool logged = false);
  // hello, prove, or any request before them in a store with a secret.
  void authenticate(Conn& c, const bootstrap::store_protocol::Request& request);
  void refuse_auth(Conn& c, const std::string& why);
  void refuse_unproven(Conn& c, Op op);  // a request other than the handshake's, unproven
  bool flush(Conn& c);
  void discard_input(Conn& c);
  void park(Conn& c, Op op, std::vector<std::string> keys, const std::string& missing);
  void resume(Conn& c);
  void notify(const std::string& key);
  void update_interest(Conn& c);
  void drop(Conn& c);
  // Logs why (within drops_'s bounds), then drops.
  void drop_logged(Conn& c, const std::string& why);
  void end_pending(Conn& c);
  void expire_pending();
  int next_timeout();
  const std::string* missing_key(const std::vector<std::string>& keys) const;

  int rank_;
  std::string name_;  // "store server on host:port", for logs
  base::Fd listener_;
  base::Fd wake_;
  base::Fd epoll_;
  base::SockAddr bound_;
  std::thread thread_;

  // Server thread only.
  std::unordered_map<std::uint64_t, std::unique_ptr<Conn>> conns_;
  std::unordered_map<std::string, std::vector<std::uint8_t>> data_;
  std::unordered_map<std::string, std::vector<std::uint64_t>> waiters_;  // key -> conn ids
  std::vector<std::uint64_t> closing_;
  std::deque<std::uint64_t> pending_;  // connection ids, oldest first
  // TLS connections whose next request may wait in OpenSSL's buffer, where epoll cannot see it.
  std::vector<std::uint64_t> tls_ready_;
  std::uint64_t next_id_ = 2;
  bool accept_failure_logged_ = false;
  const base::auth::Secret secret_ = base::auth::Secret::from_environment();
  const std::shared_ptr<const base::tls::Context> tls_ =
      base::tls::Context::from_environment(secret_);
  base::auth::FailureLog auth_failures_;
  const bootstrap::store_protocol::Limits limits_ = bootstrap::store_protocol::Limits::configured();
  const std::chrono::milliseconds handshake_timeout_ = base::limits::handshake_timeout();
  const std::size_t max_pending_ = base::limits::max_pending_connections();
  base::limits::DropLog drops_;
};

}  // namespace anview::detail
