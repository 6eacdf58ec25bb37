#include "base/tls.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "base/config.hpp"
#include "base/socket.hpp"

namespace anview::base::tls {
namespace {

const Setting tls_setting(
    "tls", "ANVIEW_TLS", "0",
    "Encrypt the store and the TCP data paths with TLS 1.3 (OpenSSL, in user space). Peers "
    "prove themselves with certificates (ANVIEW_TLS_CERT/KEY/CA) or, without them, with a key "
    "derived from the job secret. Set it on every rank, or on none");
const Setting cert_setting("tls", "ANVIEW_TLS_CERT", "",
                           "PEM certificate (chain) of this process, for ANVIEW_TLS=1");
const Setting key_setting("tls", "ANVIEW_TLS_KEY", "",
                          "PEM private key of ANVIEW_TLS_CERT; refused when its group or "
                          "others may read it");
const Setting ca_setting("tls", "ANVIEW_TLS_CA", "",
                         "PEM CA certificate(s) every peer's certificate must be signed by");

// TLS_AES_128_GCM_SHA256: the pre-shared key's suite (its hash must be SHA-256), and the
// fastest with AES instructions.
constexpr unsigned char psk_suite[] = {0x13, 0x01};
constexpr const char* suites =
    "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256";
// Ciphertext read from the socket per recv (read-ahead): several records at once.
constexpr std::size_t read_buffer_bytes = 256 * 1024;
// The largest plaintext of one record (TLS 1.3).
constexpr std::size_t max_record_bytes = 16384;

[[noreturn]] void refuse(const std::string& cause) {
  throw Error(ErrorKind::usage, {.operation = "tls", .cause = cause});
}

// The reason of the newest error in OpenSSL's queue, "" when there is none; clears the queue.
std::string openssl_error() {
  std::string text;
  while (const unsigned long e = ERR_get_error()) {
    const char* reason = ERR_reason_error_string(e);
    text = reason ? reason : "error " + std::to_string(ERR_GET_REASON(e));
  }
  return text;
}

SSL_SESSION* psk_session(SSL* ssl, const Context& context) {
  const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, psk_suite);
  if (cipher == nullptr) return nullptr;
  SSL_SESSION* session = SSL_SESSION_new();
  if (session == nullptr) return nullptr;
  if (SSL_SESSION_set1_master_key(session, context.psk().data(), context.psk().size()) != 1 ||
      SSL_SESSION_set_cipher(session, cipher) != 1 ||
      SSL_SESSION_set_protocol_version(session, TLS1_3_VERSION) != 1) {
    SSL_SESSION_free(session);
    return nullptr;
  }
  return session;
}

const Context& context_of(SSL* ssl) {
  return *static_cast<const Context*>(SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl)));
}

Session& session_of(SSL* ssl) {
  return *static_cast<Session*>(SSL_get_app_data(ssl));
}

// Client: offers the job's key under its identity.
int use_psk(SSL* ssl, const EVP_MD* md, const unsigned char** id, std::size_t* id_len,
            SSL_SESSION** out) {
  const Context& context = context_of(ssl);
  SSL_SESSION* session = psk_session(ssl, context);
  if (session == nullptr) return 0;
  if (md != nullptr && md != SSL_CIPHER_get_handshake_digest(SSL_SESSION_get0_cipher(session))) {
    // The server chose a suite this key cannot serve (HelloRetryRequest): offer none.
    SSL_SESSION_free(session);
    *out = nullptr;
    *id = nullptr;
    *id_len = 0;
    return 1;
  }
  *out = session;
  *id = reinterpret_cast<const unsigned char*>(context.psk_identity().data());
  *id_len = context.psk_identity().size();
  return 1;
}

// Server: accepts the job's key; another identity is a key from another secret.
int find_psk(SSL* ssl, const unsigned char* id, std::size_t id_len, SSL_SESSION** out) {
  const Context& context = context_of(ssl);
  *out = nullptr;
  if (std::string_view(reinterpret_cast<const char*>(id), id_len) != context.psk_identity()) {
    session_of(ssl).note_hint(
        "the client's key comes from another job secret (a different ANVIEW_SECRET there)");
    return 1;  // no such key: the handshake fails (there is no certificate to fall back on)
  }
  *out = psk_session(ssl, context);
  return *out != nullptr ? 1 : 0;
}

void refuse_if_shared(const std::string& path, const char* setting) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    refuse(std::string(setting) + "=" + path + ": " + errno_text(errno));
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0)
    refuse(std::string(setting) + "=" + path +
           " may be read by its group or others; make it private: chmod 600 " + path);
}

SSL_CTX* new_ctx(bool server) {
  SSL_CTX* ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  if (ctx == nullptr) refuse("SSL_CTX_new failed: " + openssl_error());
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_ciphersuites(ctx, suites);
  // Each SSL_write returns once a record is out: the caller's byte accounting stays exact.
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // An end of stream without close_notify reads as an end of stream: Anview's own protocols
  // (goodbye frames, replies of known length) tell a clean end from a cut one.
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_TICKET);
  SSL_CTX_set_read_ahead(ctx, 1);
  SSL_CTX_set_default_read_buffer_len(ctx, read_buffer_bytes);
  if (server) SSL_CTX_set_num_tickets(ctx, 0);  // nothing to read after the handshake
  return ctx;
}

void load_certificates(SSL_CTX* ctx, const Files& files) {
  if (SSL_CTX_use_certificate_chain_file(ctx, files.cert.c_str()) != 1)
    refuse("ANVIEW_TLS_CERT=" + files.cert + ": cannot load the certificate: " + openssl_error());
  if (SSL_CTX_use_PrivateKey_file(ctx, files.key.c_str(), SSL_FILETYPE_PEM) != 1) {
    const std::string why = openssl_error();
    if (why.find("mismatch") == std::string::npos)
      refuse("ANVIEW_TLS_KEY=" + files.key + ": cannot load the private key: " + why);
    refuse("ANVIEW_TLS_KEY=" + files.key + " is not the key of ANVIEW_TLS_CERT=" + files.cert);
  }
  if (SSL_CTX_check_private_key(ctx) != 1)
    refuse("ANVIEW_TLS_KEY=" + files.key + " is not the key of ANVIEW_TLS_CERT=" + files.cert);
  if (SSL_CTX_load_verify_locations(ctx, files.ca.c_str(), nullptr) != 1)
    refuse("ANVIEW_TLS_CA=" + files.ca + ": cannot load the CA certificates: " + openssl_error());
  // Mutual TLS: each side must present a certificate the CA signed. The CA is the trust
  // anchor of the job; host names are not checked (ranks connect by address).
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Context
// ---------------------------------------------------------------------------------------

std::shared_ptr<const Context> Context::from_environment(const auth::Secret& secret) {
  if (!tls_setting.as_bool()) return nullptr;
  const Files files{cert_setting.value(), key_setting.value(), ca_setting.value()};
  return make(files, secret);
}

std::shared_ptr<const Context> Context::make(const Files& files, const auth::Secret& secret) {
  const int named = !files.cert.empty() + !files.key.empty() + !files.ca.empty();
  if (named != 0 && named != 3)
    refuse(
        "ANVIEW_TLS_CERT, ANVIEW_TLS_KEY and ANVIEW_TLS_CA go together: set all three "
        "(certificates) or none (a key derived from the job secret)");
  if (named == 0 && secret.empty())
    refuse(
        "ANVIEW_TLS=1 needs certificates (ANVIEW_TLS_CERT, ANVIEW_TLS_KEY, ANVIEW_TLS_CA) or "
        "a job secret to derive its key from (ANVIEW_SECRET; anview-run sets one)");
  if (named == 3) refuse_if_shared(files.key, "ANVIEW_TLS_KEY");
  std::shared_ptr<Context> context(new Context());
  context->client_ = new_ctx(false);
  context->server_ = new_ctx(true);
  for (SSL_CTX* ctx : {context->client_, context->server_})
    SSL_CTX_set_app_data(ctx, context.get());
  if (named == 3) {
    context->certificates_ = true;
    load_certificates(context->client_, files);
    load_certificates(context->server_, files);
    context->description_ = "TLS 1.3, certificates signed by the CA in " + files.ca;
  } else {
    // An external pre-shared key (RFC 8446 section 2.2) with (EC)DHE, so a recorded session
    // stays secret even if the job secret leaks later. The identity names the secret without
    // revealing it: a server tells "another secret" from garbage.
    context->psk_ = secret.mac(auth::MacInput().text("anview tls 1.3 external psk v1"));
    const auth::Mac id = secret.mac(auth::MacInput().text("anview tls psk identity v1"));
    context->psk_identity_ = "anview-job-" + auth::to_hex({id.data(), 8});
    SSL_CTX_set_psk_use_session_callback(context->client_, use_psk);
    SSL_CTX_set_psk_find_session_callback(context->server_, find_psk);
    context->description_ = "TLS 1.3, a pre-shared key derived from the job secret";
  }
  return context;
}

Context::~Context() {
  SSL_CTX_free(client_);
  SSL_CTX_free(server_);
}

// ---------------------------------------------------------------------------------------
// Session
// ---------------------------------------------------------------------------------------

namespace {

// The write side of a session's socket: OpenSSL's socket BIO writes with write(), which
// raises SIGPIPE, killing the process, when the peer is gone (reset its connection after a
// protocol error, say); this one sends with MSG_NOSIGNAL, so the write fails with EPIPE like
// every other socket write of the library. The read side stays OpenSSL's socket BIO.
int nosignal_write(BIO* bio, const char* data, int bytes) {
  const int fd = static_cast<int>(reinterpret_cast<std::intptr_t>(BIO_get_data(bio)));
  const ssize_t n = ::send(fd, data, static_cast<std::size_t>(bytes), MSG_NOSIGNAL);
  BIO_clear_retry_flags(bio);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
    BIO_set_retry_write(bio);
  return static_cast<int>(n);
}

long nosignal_ctrl(BIO*, int command, long, void*) {
  return command == BIO_CTRL_FLUSH ? 1 : 0;  // nothing is buffered here
}

int nosignal_create(BIO* bio) {
  BIO_set_init(bio, 1);
  return 1;
}

const BIO_METHOD* nosignal_method() {
  static BIO_METHOD* const method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "anview socket write");
    if (m != nullptr) {
      BIO_meth_set_write(m, nosignal_write);
      BIO_meth_set_ctrl(m, nosignal_ctrl);
      BIO_meth_set_create(m, nosignal_create);
    }
    return m;
  }();
  return method;
}

// Reads through OpenSSL's socket BIO, writes through nosignal_method(); neither closes `fd`.
bool attach_socket(SSL* ssl, int fd) {
  const BIO_METHOD* method = nosignal_method();
  if (method == nullptr) return false;
  BIO* read = BIO_new_socket(fd, BIO_NOCLOSE);
  BIO* write = BIO_new(method);
  if (read == nullptr || write == nullptr) {
    BIO_free(read);
    BIO_free(write);
    return false;
  }
  BIO_set_data(write, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)));
  SSL_set_bio(ssl, read, write);  // the session owns both now
  return true;
}

}  // namespace

Session::Session(const Context& context, int fd, Role role) : fd_(fd), role_(role) {
  ssl_ = SSL_new(role == Role::client ? context.client() : context.server());
  if (ssl_ == nullptr || !attach_socket(ssl_, fd)) {
    SSL_free(ssl_);
    throw Error(ErrorKind::internal, {.operation = "tls", .cause = "SSL_new: " + openssl_error()});
  }
  SSL_set_app_data(ssl_, this);
  if (role == Role::client)
    SSL_set_connect_state(ssl_);
  else
    SSL_set_accept_state(ssl_);
}

Session::~Session() {
  SSL_free(ssl_);
}

std::string describe_configuration() {
  std::string text = std::string(OpenSSL_version(OPENSSL_VERSION)) + ": ";
  try {
    const auto context = Context::from_environment(auth::Secret::from_environment());
    return text + (context ? "on, " + context->describe() : "off (ANVIEW_TLS=0)");
  } catch (const Error& e) {
    return text + "refused: " + e.cause();
  }
}

bool looks_like_tls(const void* bytes, std::size_t size) {
  const auto* b = static_cast<const unsigned char*>(bytes);
  // A handshake record (22) of TLS 1.0 to 1.3 (record versions 3.1 to 3.3; 3.0 in old hellos).
  return size >= 2 && b[0] == 0x16 && b[1] == 0x03;
}

Session::Step Session::handshake() {
  if (established_) return Step::done;
  if (role_ == Role::server && !peeked_) {
    // A peer without TLS sends its own protocol's first bytes: say so instead of OpenSSL's
    // "wrong version number".
    unsigned char first[2];
    const ssize_t n = ::recv(fd_, first, sizeof first, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      wants_write_ = false;
      return Step::want_read;
    }
    if (n == 0) {
      failure_ = "the peer closed the connection before the TLS handshake";
      return Step::failed;
    }
    if (n == 1 && first[0] == 0x16) return Step::want_read;  // the version byte is on its way
    if (n < 0 || !looks_like_tls(first, static_cast<std::size_t>(n))) {
      plaintext_peer_ = n > 0;
      failure_ = n < 0 ? "recv(): " + errno_text(errno)
                       : "the peer does not speak TLS: set ANVIEW_TLS=1 on every rank, or on none";
      return Step::failed;
    }
    peeked_ = true;
  }
  ERR_clear_error();
  const int result = SSL_do_handshake(ssl_);
  const int saved = errno;
  if (result == 1) {
    established_ = true;
    return Step::done;
  }
  const int error = SSL_get_error(ssl_, result);
  if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
    wants_write_ = error == SSL_ERROR_WANT_WRITE;
    return wants_write_ ? Step::want_write : Step::want_read;
  }
  std::string why = openssl_error();
  const long verify = SSL_get_verify_result(ssl_);
  if (verify != X509_V_OK) {
    why = "the peer's certificate is not accepted: " +
          std::string(X509_verify_cert_error_string(verify)) + " (is it signed by ANVIEW_TLS_CA?)";
  } else if (error == SSL_ERROR_ZERO_RETURN || why == "unexpected eof while reading" ||
             (error == SSL_ERROR_SYSCALL &&
              (saved == 0 || saved == ECONNRESET || saved == EPIPE))) {
    why = std::string("the peer ") + (saved == ECONNRESET ? "reset" : "closed") +
          " the connection during the TLS handshake (does it have ANVIEW_TLS=1, the same job "
          "secret or a certificate from the same CA?)";
  } else if (error == SSL_ERROR_SYSCALL) {
    why = "TLS handshake: " + errno_text(saved);
  } else {
    why = "TLS handshake failed: " + (why.empty() ? std::string("unknown error") : why);
    if (!hint_.empty())
      why += "; " + hint_;
    else
      why +=
          " (both sides need ANVIEW_TLS=1 and the same job secret, or certificates from the "
          "same CA)";
  }
  failure_ = why;
  return Step::failed;
}

ssize_t Session::fail_io(int result, const char* what) {
  const int saved = errno;
  const int error = SSL_get_error(ssl_, result);
  switch (error) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
      wants_write_ = error == SSL_ERROR_WANT_WRITE;
      errno = EAGAIN;
      return -1;
    case SSL_ERROR_ZERO_RETURN:
      return 0;
    case SSL_ERROR_SYSCALL:
      if (ERR_peek_error() == 0 && saved == 0) return 0;  // an end of stream
      if (saved != 0) {
        ERR_clear_error();
        errno = saved;
        return -1;
      }
      break;
    default:
      break;
  }
  failure_ = std::string(what) + ": " + openssl_error();
  if (failure_.ends_with(": ")) failure_ += "TLS error " + std::to_string(error);
  errno = EPROTO;
  return -1;
}

ssize_t Session::read(void* data, std::size_t bytes) {
  const iovec one{data, bytes};
  return readv(&one, 1);
}

ssize_t Session::readv(const iovec* iov, int count) {
  std::size_t total = 0;
  for (int i = 0; i < count; ++i) {
    auto* p = static_cast<char*>(iov[i].iov_base);
    std::size_t left = iov[i].iov_len;
    while (left > 0) {
      std::size_t got = 0;
      ERR_clear_error();
      const int result = SSL_read_ex(ssl_, p, left, &got);
      if (result == 1) {
        p += got;
        left -= got;
        total += got;
        // Nothing more decrypted or buffered: stop rather than pay a read() that says EAGAIN.
        // The short count tells the caller to wait for readiness, which the socket then shows.
        if (SSL_has_pending(ssl_) == 0) return static_cast<ssize_t>(total);
        continue;
      }
      if (total > 0) {
        ERR_clear_error();  // the same condition shows again on the next call
        return static_cast<ssize_t>(total);
      }
      return fail_io(result, "SSL_read");
    }
  }
  return static_cast<ssize_t>(total);
}

ssize_t Session::writev(const iovec* iov, int count) {
  std::size_t left = 0;
  for (int k = 0; k < count; ++k) left += iov[k].iov_len;
  if (stalled_ > left) {
    failure_ = "a TLS record that did not go out whole was offered again with " +
               std::to_string(left) + " of its " + std::to_string(stalled_) + " bytes";
    errno = EPROTO;
    return -1;
  }
  std::size_t total = 0;
  int i = 0;
  std::size_t at = 0;  // into iov[i]
  while (total < left) {
    while (at >= iov[i].iov_len) at -= iov[i++].iov_len;
    // One record per call (partial writes). A record OpenSSL holds from an earlier call
    // (stalled_, encrypted already) must be offered again first, that many bytes in one piece.
    // Small pieces (a frame header, a small payload) are gathered into one record: each record
    // costs a write() and its own encryption.
    const std::size_t want = stalled_ > 0 ? stalled_ : std::min(left - total, max_record_bytes);
    const char* p = static_cast<const char*>(iov[i].iov_base) + at;
    if (iov[i].iov_len - at < want) {
      staging_.clear();
      for (int k = i; staging_.size() < want; ++k) {
        const std::size_t from = k == i ? at : 0;
        const std::size_t n = std::min(iov[k].iov_len - from, want - staging_.size());
        const auto* b = static_cast<const char*>(iov[k].iov_base) + from;
        staging_.insert(staging_.end(), b, b + n);
      }
      p = staging_.data();
    }
    std::size_t written = 0;
    ERR_clear_error();
    const int result = SSL_write_ex(ssl_, p, want, &written);
    if (result == 1) {
      stalled_ = 0;
      total += written;
      at += written;
      continue;
    }
    const int error = SSL_get_error(ssl_, result);
    if (error == SSL_ERROR_WANT_WRITE || error == SSL_ERROR_WANT_READ) stalled_ = want;
    if (total > 0) {
      ERR_clear_error();  // the same condition shows again on the next call
      return static_cast<ssize_t>(total);
    }
    return fail_io(result, "SSL_write");
  }
  return static_cast<ssize_t>(total);
}

bool Session::buffered() const {
  return SSL_has_pending(ssl_) == 1;
}

void Session::close_notify() {
  if (!established_ || stalled_) return;
  ERR_clear_error();
  SSL_shutdown(ssl_);
  ERR_clear_error();
}

std::string Session::describe() const {
  if (!established_) return "TLS handshake in progress";
  return std::string(SSL_get_version(ssl_)) + " " + SSL_get_cipher_name(ssl_);
}

// ---------------------------------------------------------------------------------------
// Blocking helpers
// ---------------------------------------------------------------------------------------

void handshake(Session& session, int fd, Deadline deadline, const ErrorContext& context) {
  for (;;) {
    switch (session.handshake()) {
      case Session::Step::done:
        return;
      case Session::Step::want_read:
        wait_ready(fd, POLLIN, deadline, context, "the TLS handshake");
        break;
      case Session::Step::want_write:
        wait_ready(fd, POLLOUT, deadline, context, "the TLS handshake");
        break;
      case Session::Step::failed: {
        ErrorContext c = context;
        c.cause = session.failure();
        throw Error(ErrorKind::auth, std::move(c));
      }
    }
  }
}

namespace {

// A transfer step through the session; a TLS failure is a protocol Error.
IoStep through(Session& session, bool writing, const ErrorContext& context) {
  return [&session, writing, &context](char* p, std::size_t n, short* wait_for) {
    const ssize_t got = writing ? session.write(p, n) : session.read(p, n);
    if (got < 0 && errno == EPROTO) {
      ErrorContext c = context;
      c.cause = session.failure();
      throw Error(ErrorKind::protocol, std::move(c));
    }
    *wait_for = session.wants_write() ? POLLOUT : POLLIN;
    return got;
  };
}

}  // namespace

void write_all(Session& session, int fd, const void* data, std::size_t bytes, Deadline deadline,
               const ErrorContext& context) {
  transfer_all(fd, static_cast<char*>(const_cast<void*>(data)), bytes,
               through(session, true, context), deadline, context, "TLS write");
}

void read_all(Session& session, int fd, void* data, std::size_t bytes, Deadline deadline,
              const ErrorContext& context) {
  transfer_all(fd, static_cast<char*>(data), bytes, through(session, false, context), deadline,
               context, "TLS read");
}

}  // namespace anview::base::tls
