// anview::Store: the public handle. Checks arguments, resolves timeouts, forwards to the
// StoreImpl of its kind.
#include <charconv>

#include "anview/error.hpp"
#include "anview/store.hpp"
#include "base/timeouts.hpp"
#include "bootstrap/store_impl.hpp"
#include "bootstrap/store_protocol.hpp"

namespace anview {
namespace {

namespace proto = bootstrap::store_protocol;

StoreOptions resolve(StoreOptions options) {
  if (options.timeout.count() < 0)
    throw Error(ErrorKind::usage,
                {.rank = options.rank,
                 .operation = "store.open",
                 .cause = "negative timeout " + std::to_string(options.timeout.count()) + " ms"});
  options.timeout = base::timeout_or_default(options.timeout);
  return options;
}

}  // namespace

namespace detail {

std::string describe_keys(const std::vector<std::string>& keys, std::size_t shown) {
  std::string out;
  for (std::size_t i = 0; i < keys.size() && i < shown; ++i) {
    if (i > 0) out += ", ";
    out += "'" + keys[i] + "'";
  }
  if (keys.size() > shown) out += " and " + std::to_string(keys.size() - shown) + " more";
  return out;
}

bool parse_counter(std::string_view text, std::int64_t& value) {
  const char* first = text.data();
  const char* last = first + text.size();
  auto [ptr, ec] = std::from_chars(first, last, value);
  return ec == std::errc() && ptr == last && first != last;
}

}  // namespace detail

namespace {

// Checks a call's arguments against the limits every store kind shares; usage Errors.
class Checker {
 public:
  Checker(const detail::StoreImpl* impl, const char* operation)
      : impl_(impl), operation_(operation), limits_(proto::Limits::configured()) {
    if (!impl_) fail("the store handle is empty (moved from)");
  }

  void key(const std::string& k) const {
    if (k.empty()) fail("empty key");
    if (k.size() > limits_.max_key_bytes)
      fail("key '" + k.substr(0, 64) + "...' is " + std::to_string(k.size()) +
           " bytes, more than the limit of " + std::to_string(limits_.max_key_bytes) +
           " (ANVIEW_STORE_MAX_KEY)");
  }

  void keys(const std::vector<std::string>& ks) const {
    if (ks.size() > proto::max_keys_per_request)
      fail(std::to_string(ks.size()) + " keys in one call, more than the limit of " +
           std::to_string(proto::max_keys_per_request));
    for (const auto& k : ks) key(k);
  }

  void value(const std::string& k, std::size_t size) const {
    if (size > limits_.max_value_bytes)
      fail("value of key '" + k + "' is " + std::to_string(size) +
           " bytes, more than the limit of " + std::to_string(limits_.max_value_bytes) +
           " (ANVIEW_STORE_MAX_VALUE)");
  }

  std::chrono::milliseconds timeout(std::optional<std::chrono::milliseconds> t) const {
    if (t && t->count() < 0) fail("negative timeout " + std::to_string(t->count()) + " ms");
    return t ? *t : impl_->options().timeout;
  }

 private:
  [[noreturn]] void fail(std::string cause) const {
    throw Error(ErrorKind::usage, {.rank = impl_ ? impl_->options().rank : -1,
                                   .operation = operation_,
                                   .cause = std::move(cause)});
  }
  const detail::StoreImpl* impl_;
  const char* operation_;
  proto::Limits limits_;
};

}  // namespace

Store::Store(std::shared_ptr<detail::StoreImpl> impl) : impl_(std::move(impl)) {}

Store Store::serve_tcp(const std::string& host_port, StoreOptions options) {
  options = resolve(options);
  return Store(detail::serve_tcp_store(host_port, options));
}

Store Store::connect_tcp(const std::string& host_port, StoreOptions options) {
  options = resolve(options);
  return Store(detail::connect_tcp_store(host_port, options));
}

Store Store::file(const std::string& directory, StoreOptions options) {
  options = resolve(options);
  return Store(detail::open_file_store(directory, options));
}

Store Store::wrap(std::shared_ptr<StoreBackend> backend, StoreOptions options) {
  options = resolve(options);
  if (!backend)
    throw Error(ErrorKind::usage,
                {.rank = options.rank, .operation = "store.wrap", .cause = "null backend"});
  return Store(detail::wrap_store(std::move(backend), options));
}

void Store::set(const std::string& key, const Bytes& value,
                std::optional<std::chrono::milliseconds> timeout) {
  const Checker check(impl_.get(), "store.set");
  check.key(key);
  check.value(key, value.size());
  impl_->set(key, value.data(), value.size(), check.timeout(timeout));
}

void Store::set(const std::string& key, const std::string& value,
                std::optional<std::chrono::milliseconds> timeout) {
  const Checker check(impl_.get(), "store.set");
  check.key(key);
  check.value(key, value.size());
  impl_->set(key, reinterpret_cast<const std::uint8_t*>(value.data()), value.size(),
             check.timeout(timeout));
}

Store::Bytes Store::get(const std::string& key, std::optional<std::chrono::milliseconds> timeout) {
  const Checker check(impl_.get(), "store.get");
  check.key(key);
  return impl_->get(key, check.timeout(timeout));
}

std::string Store::get_string(const std::string& key,
                              std::optional<std::chrono::milliseconds> timeout) {
  const Bytes value = get(key, timeout);
  return std::string(value.begin(), value.end());
}

std::int64_t Store::add(const std::string& key, std::int64_t delta) {
  const Checker check(impl_.get(), "store.add");
  check.key(key);
  return impl_->add(key, delta, impl_->options().timeout);
}

bool Store::check(const std::vector<std::string>& keys,
                  std::optional<std::chrono::milliseconds> timeout) {
  const Checker check(impl_.get(), "store.check");
  check.keys(keys);
  const auto t = check.timeout(timeout);
  if (keys.empty()) return true;
  return impl_->check(keys, t);
}

void Store::wait(const std::vector<std::string>& keys,
                 std::optional<std::chrono::milliseconds> timeout) {
  const Checker check(impl_.get(), "store.wait");
  check.keys(keys);
  const auto t = check.timeout(timeout);
  if (keys.empty()) return;
  impl_->wait(keys, t);
}

std::string Store::address() const {
  const Checker check(impl_.get(), "store.address");
  return impl_->address();
}

}  // namespace anview
