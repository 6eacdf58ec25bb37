// The implementation behind anview::Store. One subclass per store kind (store_tcp.cpp,
// store_file.cpp); the public handle (store.cpp) checks arguments, resolves the default
// timeout and forwards here.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "anview/store.hpp"

namespace anview::detail {

// Every method is thread-safe and may block up to the timeout it is given (set, add and
// check get the store's default timeout from the handle). Failures are anview::Error with
// kind timeout, link, protocol, usage or internal, operation "store.<op>" and the keys in
// the cause. Arguments arrive checked: keys non-empty and at most 4 KiB, values at most
// 64 MiB, at most 1024 keys per call, at least one.
class StoreImpl {
 public:
  using Bytes = std::vector<std::uint8_t>;
  using Timeout = std::chrono::milliseconds;

  explicit StoreImpl(const StoreOptions& options) : options_(options) {}
  virtual ~StoreImpl() = default;
  StoreImpl(const StoreImpl&) = delete;
  StoreImpl& operator=(const StoreImpl&) = delete;

  // The timeout (ANVIEW_TIMEOUT when the caller gave none) and rank the store was opened with.
  const StoreOptions& options() const { return options_; }

  virtual void set(const std::string& key, const std::uint8_t* data, std::size_t size,
                   Timeout timeout) = 0;
  virtual Bytes get(const std::string& key, Timeout timeout) = 0;
  // The value is kept as decimal text ("42"); a value that is not one is a usage Error.
  virtual std::int64_t add(const std::string& key, std::int64_t delta, Timeout timeout) = 0;
  virtual bool check(const std::vector<std::string>& keys, Timeout timeout) = 0;
  virtual void wait(const std::vector<std::string>& keys, Timeout timeout) = 0;
  virtual std::string address() const = 0;

 private:
  StoreOptions options_;
};

// `options.timeout` is already resolved (ANVIEW_TIMEOUT in place of zero) when called.
std::shared_ptr<StoreImpl> serve_tcp_store(const std::string& host_port,
                                           const StoreOptions& options);
std::shared_ptr<StoreImpl> connect_tcp_store(const std::string& host_port,
                                             const StoreOptions& options);
std::shared_ptr<StoreImpl> open_file_store(const std::string& directory,
                                           const StoreOptions& options);
std::shared_ptr<StoreImpl> wrap_store(std::shared_ptr<StoreBackend> backend,
                                      const StoreOptions& options);

// "'a', 'b', 'c' and 7 more": keys for an error's cause, at most `shown` of them.
std::string describe_keys(const std::vector<std::string>& keys, std::size_t shown = 8);
// Parses the decimal text an add keeps; false when it is not an int64.
bool parse_counter(std::string_view text, std::int64_t& value);

}  // namespace anview::detail
