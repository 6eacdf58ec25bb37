// base::tls on socket pairs: both kinds of authentication (a key derived from the job secret,
// certificates from one CA), what a wrong key, a foreign certificate, a plain peer and
// garbage get, bulk data through stalled writes, and the end of the stream.
#include "base/tls.hpp"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <tuple>
#include <vector>

#include "support/expect_error.hpp"
#include "support/test_certs.hpp"

namespace anview::base::tls {
namespace {

namespace fs = std::filesystem;
using anview::testing::expect_error;

// Two ends of a non-blocking socket pair, each with its session.
struct Pair {
  int fds[2] = {-1, -1};
  std::unique_ptr<Session> client, server;

  Pair(const Context& client_context, const Context& server_context, int sndbuf = 0) {
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
    if (sndbuf > 0)
      for (int fd : fds) ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    client = std::make_unique<Session>(client_context, fds[0], Role::client);
    server = std::make_unique<Session>(server_context, fds[1], Role::server);
  }
  ~Pair() {
    client.reset();
    server.reset();
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
  }

  // Steps both handshakes until both are done or one failed; true when both are done.
  bool handshake() {
    for (int i = 0; i < 100; ++i) {
      const auto c = client->handshake();
      const auto s = server->handshake();
      if (c == Session::Step::failed || s == Session::Step::failed) return false;
      if (c == Session::Step::done && s == Session::Step::done) return true;
    }
    ADD_FAILURE() << "the handshake did not finish";
    return false;
  }
};

std::shared_ptr<const Context> psk(const std::string& secret) {
  return Context::make({}, auth::Secret(secret));
}

class TlsFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "anview-tls-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST(TlsSession, AKeyFromTheJobSecretConnectsTls13) {
  const auto context = psk("job secret");
  Pair pair(*context, *context);
  ASSERT_TRUE(pair.handshake()) << pair.client->failure() << " / " << pair.server->failure();
  EXPECT_EQ(pair.client->describe(), "TLSv1.3 TLS_AES_128_GCM_SHA256");
  EXPECT_FALSE(context->uses_certificates());
  EXPECT_NE(context->describe().find("pre-shared key"), std::string::npos);
}

TEST(TlsSession, BulkDataCrossesThroughStalledWritesIntact) {
  const auto context = psk("job secret");
  Pair pair(*context, *context, 16 * 1024);  // small socket buffers: writes stall often
  ASSERT_TRUE(pair.handshake());
  std::vector<char> sent(4 << 20), got(sent.size() + 100);
  std::mt19937 rng(7);
  for (auto& c : sent) c = static_cast<char>(rng());
  std::size_t written = 0, read = 0;
  bool stalled = false;
  for (int round = 0; round < 1000000 && read < sent.size(); ++round) {
    if (written < sent.size()) {
      // Three pieces per call, like a frame's header and payload.
      const std::size_t left = sent.size() - written;
      const std::size_t a = std::min<std::size_t>(40, left), b = std::min(left - a, 70000ul);
      iovec iov[3] = {{sent.data() + written, a},
                      {sent.data() + written + a, b},
                      {sent.data() + written + a + b, left - a - b}};
      const ssize_t n = pair.client->writev(iov, 3);
      if (n > 0) written += static_cast<std::size_t>(n);
      if (n < 0) {
        ASSERT_EQ(errno, EAGAIN) << pair.client->failure();
      }
      stalled = stalled || pair.client->write_stalled();
    }
    iovec in[2] = {{got.data() + read, 1000}, {got.data() + read + 1000, 200000}};
    const ssize_t n = pair.server->readv(in, 2);
    if (n > 0) read += static_cast<std::size_t>(n);
    if (n < 0) {
      ASSERT_EQ(errno, EAGAIN) << pair.server->failure();
    }
    ASSERT_NE(n, 0) << "end of stream in the middle";
  }
  ASSERT_EQ(read, sent.size());
  EXPECT_EQ(std::memcmp(sent.data(), got.data(), sent.size()), 0);
  EXPECT_TRUE(stalled) << "the test meant to fill the socket buffer";
  EXPECT_FALSE(pair.server->buffered());
}

// A peer that is gone while this side writes: the write fails with EPIPE. OpenSSL's socket
// BIO writes with write(), which raised SIGPIPE: the process died (seen in a 4-rank TLS job
// whose peer closed its connections after a protocol error).
TEST(TlsSession, WritingToAPeerThatIsGoneFailsWithEpipeNotSigpipe) {
  const auto context = psk("job secret");
  Pair pair(*context, *context);
  ASSERT_TRUE(pair.handshake());
  pair.server.reset();
  ::close(pair.fds[1]);
  pair.fds[1] = -1;
  const char data[100] = {};
  ssize_t n = 0;
  for (int i = 0; i < 10 && n >= 0; ++i) n = pair.client->write(data, sizeof data);
  ASSERT_LT(n, 0);
  EXPECT_EQ(errno, EPIPE) << pair.client->failure();
}

TEST(TlsSession, AKeyFromAnotherSecretIsRefusedAndNamed) {
  const auto ours = psk("job secret");
  const auto theirs = psk("another secret");
  Pair pair(*theirs, *ours);
  EXPECT_FALSE(pair.handshake());
  EXPECT_NE(pair.server->failure().find("another job secret"), std::string::npos)
      << pair.server->failure();
  // The client learns only that the handshake failed.
  for (int i = 0; i < 10 && pair.client->failure().empty(); ++i) pair.client->handshake();
  EXPECT_FALSE(pair.client->failure().empty());
}

TEST(TlsSession, APlainPeerIsToldApartFromGarbage) {
  const auto context = psk("job secret");
  Pair pair(*context, *context);
  const char hello[] = "ANVW plain hello";
  ASSERT_EQ(::send(pair.fds[0], hello, sizeof hello, 0), static_cast<ssize_t>(sizeof hello));
  EXPECT_EQ(pair.server->handshake(), Session::Step::failed);
  EXPECT_TRUE(pair.server->plaintext_peer());
  EXPECT_NE(pair.server->failure().find("does not speak TLS"), std::string::npos)
      << pair.server->failure();
  char first[4];
  EXPECT_EQ(::recv(pair.fds[1], first, 4, MSG_PEEK), 4) << "the owner may still read them";
}

TEST(TlsSession, GarbageInsideTheStreamIsAProtocolError) {
  const auto context = psk("job secret");
  Pair pair(*context, *context);
  ASSERT_TRUE(pair.handshake());
  // An application-data record header with a body that no key decrypts.
  std::vector<unsigned char> record = {0x17, 0x03, 0x03, 0x00, 0x40};
  record.resize(5 + 0x40, 0xAB);
  ASSERT_EQ(::send(pair.fds[0], record.data(), record.size(), 0),
            static_cast<ssize_t>(record.size()));
  char buffer[256];
  EXPECT_EQ(pair.server->read(buffer, sizeof buffer), -1);
  EXPECT_EQ(errno, EPROTO);
  EXPECT_NE(pair.server->failure().find("SSL_read"), std::string::npos) << pair.server->failure();
}

TEST(TlsSession, CloseNotifyReadsAsTheEndOfTheStreamWhileTheOtherWayGoesOn) {
  const auto context = psk("job secret");
  Pair pair(*context, *context);
  ASSERT_TRUE(pair.handshake());
  ASSERT_EQ(pair.client->write("last", 4), 4);
  pair.client->close_notify();
  ::shutdown(pair.fds[0], SHUT_WR);
  char buffer[16];
  EXPECT_EQ(pair.server->read(buffer, sizeof buffer), 4);
  EXPECT_EQ(pair.server->read(buffer, sizeof buffer), 0);
  // A plain end of stream (no close_notify) reads the same.
  ASSERT_EQ(pair.server->write("reply", 5), 5);
  ::shutdown(pair.fds[1], SHUT_WR);
  EXPECT_EQ(pair.client->read(buffer, sizeof buffer), 5);
  EXPECT_EQ(pair.client->read(buffer, sizeof buffer), 0);
}

TEST_F(TlsFiles, CertificatesOfTheJobsCaConnectAndOthersAreRefused) {
  const anview::testing::TestPki pki(dir_);
  const auto& [a, b, r] = std::tie(pki.first, pki.second, pki.foreign);
  const std::string& ca_file = pki.ca_file;
  const auto context_a = Context::make({a.cert, a.key, ca_file}, {});
  const auto context_b = Context::make({b.cert, b.key, ca_file}, {});
  EXPECT_TRUE(context_a->uses_certificates());
  {
    Pair pair(*context_a, *context_b);
    ASSERT_TRUE(pair.handshake()) << pair.client->failure() << " / " << pair.server->failure();
  }
  const auto context_r = Context::make({r.cert, r.key, ca_file}, {});
  Pair client_rogue(*context_r, *context_a);
  EXPECT_FALSE(client_rogue.handshake());
  EXPECT_NE(client_rogue.server->failure().find("not accepted"), std::string::npos)
      << client_rogue.server->failure();
  Pair server_rogue(*context_a, *context_r);
  EXPECT_FALSE(server_rogue.handshake());
  EXPECT_NE(server_rogue.client->failure().find("not accepted"), std::string::npos)
      << server_rogue.client->failure();
}

TEST_F(TlsFiles, SettingsAreCheckedWhenTheContextIsMade) {
  const anview::testing::TestPki pki(dir_);
  const auto& a = pki.first;
  const std::string& ca_file = pki.ca_file;
  Error e = expect_error([&] { Context::make({a.cert, "", ca_file}, auth::Secret("s")); });
  EXPECT_EQ(e.kind(), ErrorKind::usage);
  EXPECT_NE(e.cause().find("go together"), std::string::npos) << e.what();
  e = expect_error([&] { Context::make({}, {}); });
  EXPECT_NE(e.cause().find("job secret"), std::string::npos) << e.what();
  ::chmod(a.key.c_str(), 0644);
  e = expect_error([&] { Context::make({a.cert, a.key, ca_file}, {}); });
  EXPECT_NE(e.cause().find("chmod 600"), std::string::npos) << e.what();
  ::chmod(a.key.c_str(), 0600);
  e = expect_error([&] { Context::make({ca_file, a.key, ca_file}, {}); });
  EXPECT_NE(e.cause().find("is not the key of"), std::string::npos) << e.what();
  e = expect_error([&] { Context::make({(dir_ / "none.pem").string(), a.key, ca_file}, {}); });
  EXPECT_NE(e.cause().find("cannot load the certificate"), std::string::npos) << e.what();
}

TEST(TlsBytes, AClientHelloIsRecognised) {
  const unsigned char hello[] = {0x16, 0x03, 0x01, 0x00, 0xF4};
  const unsigned char anview[] = {'A', 'N', 'V', 'W'};
  EXPECT_TRUE(looks_like_tls(hello, sizeof hello));
  EXPECT_FALSE(looks_like_tls(anview, sizeof anview));
  EXPECT_FALSE(looks_like_tls(hello, 1));
}

}  // namespace
}  // namespace anview::base::tls
