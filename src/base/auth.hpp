// The job secret and the proofs made with it. A job with a secret runs a mutual
// challenge-response on every connection (the store, the TCP data paths) before anything
// else is accepted: each side sends a fresh nonce and answers the other's with an HMAC-SHA256
// bound to both nonces, the roles and what the connection is for (SECURITY.md;
// docs/wire-protocol.md and docs/store-protocol.md, "Authentication"). OpenSSL does the
// cryptography.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

namespace anview::base::auth {

inline constexpr std::size_t nonce_bytes = 16;
inline constexpr std::size_t mac_bytes = 32;
using Nonce = std::array<std::uint8_t, nonce_bytes>;
using Mac = std::array<std::uint8_t, mac_bytes>;

// What a proof covers: every part is prefixed by its length, so no two different lists of
// parts read as the same input.
class MacInput {
 public:
  MacInput& text(std::string_view s);
  MacInput& u64(std::uint64_t v);
  MacInput& bytes(std::span<const std::uint8_t> b);
  const std::vector<std::uint8_t>& data() const { return data_; }

 private:
  std::vector<std::uint8_t> data_;
};

class Secret {
 public:
  Secret() = default;
  explicit Secret(std::string key) : key_(std::move(key)) {}

  // ANVIEW_SECRET, else the contents of the file ANVIEW_SECRET_FILE (a trailing newline
  // dropped). A usage Error when the file cannot be read, is empty, or may be read by its
  // group or by others. Empty when neither is set: the job runs without authentication.
  static Secret from_environment();

  bool empty() const { return key_.empty(); }
  Mac mac(const MacInput& input) const;  // HMAC-SHA256 keyed with the secret

 private:
  std::string key_;
};

Nonce fresh_nonce();  // from OpenSSL's generator; an internal Error if it fails
// Compares in constant time (a peer learns nothing from how long a wrong proof took).
bool same(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b);
// 32 random bytes in hex: the secret anview-run gives each job.
std::string fresh_secret();
std::string to_hex(std::span<const std::uint8_t> bytes);

// Which remote hosts' authentication failures were logged: the first failure of a host is, the
// ones after it are not (beyond 1024 remembered hosts, every failure is).
class FailureLog {
 public:
  // True when a failure from `remote` ("host:port") is to be logged; `host` gets its host.
  bool first(const std::string& remote, std::string* host);

 private:
  std::unordered_set<std::string> hosts_;
};

}  // namespace anview::base::auth
