// Optional TLS 1.3 on TCP connections (the store, the TCP data paths), in user space with
// OpenSSL: the kernel here has no kTLS. ANVIEW_TLS=1 turns it on; the peers authenticate
// each other either with certificates signed by one CA (ANVIEW_TLS_CERT, ANVIEW_TLS_KEY,
// ANVIEW_TLS_CA: mutual TLS) or, without certificates, with an external pre-shared key derived
// from the job secret (anview-run makes one per job). SECURITY.md, "Encryption".
//
// A Session wraps a non-blocking socket its owner keeps: read, readv and writev behave like
// recv/readv/sendmsg on it (bytes moved, 0 at the end of the stream, -1 with errno), so the
// owners' event loops stay as they are.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "anview/error.hpp"
#include "base/auth.hpp"
#include "base/clock.hpp"

using SSL = struct ssl_st;
using SSL_CTX = struct ssl_ctx_st;

namespace anview::base::tls {

// Where the TLS settings of this process point.
struct Files {
  std::string cert;  // PEM certificate (chain) of this process
  std::string key;   // PEM private key of `cert`
  std::string ca;    // PEM CA certificates that sign every peer's certificate
};

// The TLS configuration of this process: one client and one server SSL_CTX, TLS 1.3 only.
class Context {
 public:
  // From ANVIEW_TLS and its settings; null when ANVIEW_TLS is off. A usage Error when the
  // files cannot be loaded, name only some of cert/key/CA, or when there are neither files nor
  // a job secret to derive the key from.
  static std::shared_ptr<const Context> from_environment(const auth::Secret& secret);
  // Certificates when `files.cert` is set, else the pre-shared key derived from `secret`.
  static std::shared_ptr<const Context> make(const Files& files, const auth::Secret& secret);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  SSL_CTX* client() const { return client_; }
  SSL_CTX* server() const { return server_; }
  bool uses_certificates() const { return certificates_; }
  // "TLS 1.3, certificates signed by the CA in /etc/anview/ca.pem" or
  // "TLS 1.3, a pre-shared key derived from the job secret".
  const std::string& describe() const { return description_; }

  // The pre-shared key and the identity that names it (server and client callbacks).
  const std::string& psk_identity() const { return psk_identity_; }
  const auth::Mac& psk() const { return psk_; }

 private:
  Context() = default;

  SSL_CTX* client_ = nullptr;
  SSL_CTX* server_ = nullptr;
  bool certificates_ = false;
  std::string description_;
  std::string psk_identity_;
  auth::Mac psk_{};
};

enum class Role { client, server };

// One TLS session over a connected non-blocking socket (not owned: it must outlive the session).
class Session {
 public:
  Session(const Context& context, int fd, Role role);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  enum class Step { done, want_read, want_write, failed };
  // Drives the handshake; call again on the readiness it asks for. On `failed`, failure()
  // says why, with a hint when the peer does not speak TLS at all (ANVIEW_TLS on one side
  // only) or holds another key or certificate.
  Step handshake();
  bool established() const { return established_; }

  // Like recv/readv/sendmsg on a non-blocking socket: the bytes moved (> 0), 0 at the peer's
  // end of the stream, or -1 with errno EAGAIN (wants_write() tells which readiness to wait
  // for), EPROTO (failure() says why) or the socket's error. readv and writev move as much
  // as they can: a short count means the socket would block.
  ssize_t read(void* data, std::size_t bytes);
  ssize_t readv(const iovec* iov, int count);
  ssize_t writev(const iovec* iov, int count);
  ssize_t write(const void* data, std::size_t bytes) {
    const iovec one{const_cast<void*>(data), bytes};
    return writev(&one, 1);
  }
  // The last call that set EAGAIN waits for writability (else for readability).
  bool wants_write() const { return wants_write_; }
  // Received data held in OpenSSL's buffers, which the socket's readiness no longer shows.
  bool buffered() const;
  // A record that did not go out whole waits inside OpenSSL: the next writev must start with
  // the same bytes (a caller must not put anything before them), in pieces of any size.
  bool write_stalled() const { return stalled_ > 0; }
  // How many of the bytes offered next that record holds (0: none waits).
  std::size_t stalled_bytes() const { return stalled_; }
  // Sends close_notify, best effort (before a half-close).
  void close_notify();
  const std::string& failure() const { return failure_; }
  // The handshake failed because the client spoke plain text (ANVIEW_TLS on this side only):
  // the owner may answer in its plain protocol. Its first bytes are still in the socket.
  bool plaintext_peer() const { return plaintext_peer_; }
  // Adds what a callback learned to a handshake failure's text (internal use).
  void note_hint(std::string hint) { hint_ = std::move(hint); }
  // "TLSv1.3 TLS_AES_128_GCM_SHA256" once established.
  std::string describe() const;

 private:
  // Maps an SSL_* result to the errno contract; returns -1 or 0.
  ssize_t fail_io(int result, const char* what);

  SSL* ssl_ = nullptr;
  int fd_;
  Role role_;
  bool established_ = false;
  bool wants_write_ = false;
  bool peeked_ = false;        // the server looked at the client's first bytes
  std::size_t stalled_ = 0;    // bytes of a record OpenSSL holds, not yet reported written
  std::vector<char> staging_;  // those bytes, gathered when the caller's pieces are smaller
  bool plaintext_peer_ = false;
  std::string failure_;
  std::string hint_;
};

// Blocking helpers with a deadline, for the store client: a timeout Error at the deadline, a
// link Error when the peer closes or resets, an auth Error when the handshake fails.
void handshake(Session& session, int fd, Deadline deadline, const ErrorContext& context);
void write_all(Session& session, int fd, const void* data, std::size_t bytes, Deadline deadline,
               const ErrorContext& context);
void read_all(Session& session, int fd, void* data, std::size_t bytes, Deadline deadline,
              const ErrorContext& context);

// For anview-info: "OpenSSL 3.0.19 ...: off (ANVIEW_TLS=0)", or what ANVIEW_TLS=1 uses here,
// or why its settings are refused.
std::string describe_configuration();

// True when `bytes` start like a TLS handshake record (a ClientHello): what a plain listener
// sees from a peer with ANVIEW_TLS=1.
bool looks_like_tls(const void* bytes, std::size_t size);

}  // namespace anview::base::tls
