#include "base/auth.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <cerrno>
#include <fstream>
#include <iterator>
#include <sstream>

#include "anview/error.hpp"
#include "base/config.hpp"
#include "base/socket.hpp"

namespace anview::base::auth {
namespace {

const Setting secret_setting(
    "auth", "ANVIEW_SECRET", "",
    "The job's secret: every connection (store, TCP data paths) proves it both ways before "
    "anything else is accepted. anview-run makes a fresh one for each job; set the same value "
    "on every rank when launching otherwise. Never printed",
    Setting::Visibility::hidden);
const Setting secret_file_setting(
    "auth", "ANVIEW_SECRET_FILE", "",
    "A file holding the job's secret (used when ANVIEW_SECRET is unset); refused when its group "
    "or others may read it");

[[noreturn]] void refuse(const std::string& cause) {
  throw Error(ErrorKind::usage, {.operation = "auth", .cause = cause});
}

}  // namespace

MacInput& MacInput::text(std::string_view s) {
  u64(s.size());
  data_.insert(data_.end(), s.begin(), s.end());
  return *this;
}

MacInput& MacInput::u64(std::uint64_t v) {
  for (int i = 0; i < 8; ++i) data_.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  return *this;
}

MacInput& MacInput::bytes(std::span<const std::uint8_t> b) {
  u64(b.size());
  data_.insert(data_.end(), b.begin(), b.end());
  return *this;
}

Secret Secret::from_environment() {
  if (secret_setting.from_environment()) return Secret(secret_setting.value());
  if (!secret_file_setting.from_environment()) return Secret();
  const std::string path = secret_file_setting.value();
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    refuse("ANVIEW_SECRET_FILE=" + path + ": " + errno_text(errno));
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    refuse("ANVIEW_SECRET_FILE=" + path + " may be read by its group or others (mode " + mode +
           "); make it private: chmod 600 " + path);
  }
  std::ifstream in(path, std::ios::binary);
  std::string key((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) refuse("ANVIEW_SECRET_FILE=" + path + " could not be read");
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r')) key.pop_back();
  if (key.empty()) refuse("ANVIEW_SECRET_FILE=" + path + " is empty");
  return Secret(std::move(key));
}

Mac Secret::mac(const MacInput& input) const {
  Mac out{};
  unsigned int length = 0;
  const auto& data = input.data();
  if (HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()), data.data(), data.size(),
           out.data(), &length) == nullptr ||
      length != out.size())
    throw Error(ErrorKind::internal, {.operation = "auth", .cause = "HMAC-SHA256 failed"});
  return out;
}

namespace {

void random_bytes(std::span<std::uint8_t> out) {
  if (RAND_bytes(out.data(), static_cast<int>(out.size())) != 1)
    throw Error(ErrorKind::internal,
                {.operation = "auth", .cause = "the random generator (RAND_bytes) failed"});
}

}  // namespace

Nonce fresh_nonce() {
  Nonce n{};
  random_bytes(n);
  return n;
}

bool same(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string fresh_secret() {
  std::array<std::uint8_t, 32> bytes{};
  random_bytes(bytes);
  return to_hex(bytes);
}

std::string to_hex(std::span<const std::uint8_t> bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string text;
  for (const std::uint8_t b : bytes) {
    text += digits[b >> 4];
    text += digits[b & 15];
  }
  return text;
}

bool FailureLog::first(const std::string& remote, std::string* host) {
  std::uint16_t port = 0;
  if (!split_host_port(remote, host, &port)) *host = remote;
  if (hosts_.contains(*host)) return false;
  if (hosts_.size() < 1024) hosts_.insert(*host);
  return true;
}

}  // namespace anview::base::auth
