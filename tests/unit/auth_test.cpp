// base/auth: where the job secret comes from, and the pieces of the proofs.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <string>

#include "anview/error.hpp"
#include "base/auth.hpp"

namespace anview::base::auth {
namespace {

// Sets or clears the two variables for one test, and restores them after.
class SecretEnvironment : public ::testing::Test {
 protected:
  void SetUp() override {
    save("ANVIEW_SECRET", secret_);
    save("ANVIEW_SECRET_FILE", file_);
    ::unsetenv("ANVIEW_SECRET");
    ::unsetenv("ANVIEW_SECRET_FILE");
  }
  void TearDown() override {
    restore("ANVIEW_SECRET", secret_);
    restore("ANVIEW_SECRET_FILE", file_);
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  std::string write_file(const std::string& text, mode_t mode) {
    path_ = ::testing::TempDir() + "anview-secret-" + std::to_string(::getpid());
    std::ofstream(path_) << text;
    ::chmod(path_.c_str(), mode);
    return path_;
  }

 private:
  static void save(const char* name, std::optional<std::string>& into) {
    if (const char* v = std::getenv(name)) into = v;
  }
  static void restore(const char* name, const std::optional<std::string>& value) {
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  std::optional<std::string> secret_, file_;
  std::string path_;
};

Error expect_usage_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::usage) << e.what();
    return e;
  }
  ADD_FAILURE() << "no error";
  return Error(ErrorKind::internal, {});
}

TEST_F(SecretEnvironment, NoneSetMeansNoSecret) {
  EXPECT_TRUE(Secret::from_environment().empty());
}

TEST_F(SecretEnvironment, TheVariableWins) {
  ::setenv("ANVIEW_SECRET", "abc", 1);
  ::setenv("ANVIEW_SECRET_FILE", "/nonexistent", 1);
  const Secret s = Secret::from_environment();
  EXPECT_FALSE(s.empty());
  EXPECT_EQ(s.mac(MacInput().text("x")), Secret("abc").mac(MacInput().text("x")));
}

TEST_F(SecretEnvironment, APrivateFileIsReadWithoutItsNewline) {
  ::setenv("ANVIEW_SECRET_FILE", write_file("from-a-file\n", 0600).c_str(), 1);
  const Secret s = Secret::from_environment();
  EXPECT_EQ(s.mac(MacInput().text("x")), Secret("from-a-file").mac(MacInput().text("x")));
}

TEST_F(SecretEnvironment, AFileOthersMayReadIsRefused) {
  const std::string path = write_file("k", 0644);
  ::setenv("ANVIEW_SECRET_FILE", path.c_str(), 1);
  const Error e = expect_usage_error([] { Secret::from_environment(); });
  EXPECT_NE(e.cause().find("mode 0644"), std::string::npos) << e.what();
  EXPECT_NE(e.cause().find("chmod 600 " + path), std::string::npos) << e.what();
}

TEST_F(SecretEnvironment, AnEmptyOrMissingFileIsRefused) {
  ::setenv("ANVIEW_SECRET_FILE", write_file("\n", 0600).c_str(), 1);
  EXPECT_NE(expect_usage_error([] { Secret::from_environment(); }).cause().find("is empty"),
            std::string::npos);
  ::setenv("ANVIEW_SECRET_FILE", "/nonexistent/anview-secret", 1);
  EXPECT_NE(expect_usage_error([] { Secret::from_environment(); }).cause().find("/nonexistent"),
            std::string::npos);
}

TEST(Auth, PartsAreLengthPrefixedSoTheirBoundariesCount) {
  const Secret s("k");
  EXPECT_NE(s.mac(MacInput().text("ab").text("c")), s.mac(MacInput().text("a").text("bc")));
  EXPECT_EQ(s.mac(MacInput().text("ab").u64(7)), s.mac(MacInput().text("ab").u64(7)));
  EXPECT_NE(s.mac(MacInput().u64(1)), s.mac(MacInput().u64(2)));
}

TEST(Auth, MacIsHmacSha256OfTheLengthPrefixedParts) {
  // RFC 4231 test case 2's key and data, the data as one part: its length (u64, little
  // endian) then its bytes. Expected value from Python's hmac module:
  //   hmac.new(b"Jefe", struct.pack("<Q", 28) + b"what do ya want for nothing?", "sha256")
  EXPECT_EQ(to_hex(Secret("Jefe").mac(MacInput().text("what do ya want for nothing?"))),
            "c0b77cf99718fc7f09c8727ff74305bde25761b2db20b1081cfcc82a3ec6029e");
}

TEST(Auth, NoncesAndSecretsAreFresh) {
  EXPECT_NE(fresh_nonce(), fresh_nonce());
  const std::string a = fresh_secret(), b = fresh_secret();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  EXPECT_NE(a, b);
}

TEST(Auth, SameComparesWholeValues) {
  const Mac a = Secret("k").mac(MacInput().text("x"));
  Mac b = a;
  EXPECT_TRUE(same(a, b));
  b[31] ^= 1;
  EXPECT_FALSE(same(a, b));
  EXPECT_FALSE(same(std::span(a).first(16), a));
}

}  // namespace
}  // namespace anview::base::auth
