// anview::Store — the key-value store ranks use to find each other (bootstrap).
//
// Three kinds:
//  - TCP store: one rank (rank 0 by convention) serves it at host:port; every rank, the server
//    included, talks to it as a client. Wire format: docs/store-protocol.md.
//  - File store: a directory on a file system every rank can see (one file per key, written
//    atomically by rename).
//  - A store kept by someone else (PyTorch's c10d store, a service's own registry): any
//    StoreBackend, wrapped with Store::wrap.
// All calls are thread-safe and blocking; every one that waits takes a timeout (default:
// the store's, from ANVIEW_TIMEOUT) and raises anview::Error(timeout) naming the keys.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace anview {

namespace detail {
class StoreImpl;
}

struct StoreOptions {
  // Deadline for each blocking call (and for connecting to a TCP store). Zero means "the
  // ANVIEW_TIMEOUT setting" (default 300 s).
  std::chrono::milliseconds timeout{0};
  int rank = -1;  // only used to name this process in errors and logs
};

// What a store kept elsewhere provides to be used as an anview::Store (Store::wrap). Calls
// may come from several threads at once. Failures may throw anything derived from
// std::exception: the wrapper turns them into anview::Error naming the call and the keys.
class StoreBackend {
 public:
  using Bytes = std::vector<std::uint8_t>;
  virtual ~StoreBackend() = default;
  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Waits up to `timeout` for the key, then returns its value.
  virtual Bytes get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Adds delta to the integer kept at key (missing = 0; kept as decimal text) and returns it.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
  virtual bool check(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Where the store lives, for messages ("c10d TCPStore 10.0.0.1:29500").
  virtual std::string address() const = 0;
};

class Store {
 public:
  using Bytes = std::vector<std::uint8_t>;

  // Serves a TCP store at `host_port` ("0.0.0.0:29500", "127.0.0.1:0" for a free port) from a
  // background thread of this process, and returns a client of it. The server lives as long as
  // any copy of the returned handle.
  static Store serve_tcp(const std::string& host_port, StoreOptions options = {});
  // Connects to a TCP store served elsewhere, retrying until options.timeout while the server
  // is not up yet.
  static Store connect_tcp(const std::string& host_port, StoreOptions options = {});
  // A store kept in `directory` (created if missing).
  static Store file(const std::string& directory, StoreOptions options = {});
  // A store kept by `backend` (not null). Arguments are checked against the same limits as
  // for the other kinds before they reach it.
  static Store wrap(std::shared_ptr<StoreBackend> backend, StoreOptions options = {});

  // Sets key to value, replacing any previous value; wakes waiters.
  void set(const std::string& key, const Bytes& value,
           std::optional<std::chrono::milliseconds> timeout = {});
  void set(const std::string& key, const std::string& value,
           std::optional<std::chrono::milliseconds> timeout = {});
  // Waits until key exists, then returns its value.
  Bytes get(const std::string& key, std::optional<std::chrono::milliseconds> timeout = {});
  std::string get_string(const std::string& key,
                         std::optional<std::chrono::milliseconds> timeout = {});
  // Atomically adds delta to the integer stored at key (missing = 0) and returns the result.
  std::int64_t add(const std::string& key, std::int64_t delta);
  // True when every key exists (does not wait for them; the timeout bounds the exchange
  // with a TCP store).
  bool check(const std::vector<std::string>& keys,
             std::optional<std::chrono::milliseconds> timeout = {});
  // Waits until every key exists.
  void wait(const std::vector<std::string>& keys,
            std::optional<std::chrono::milliseconds> timeout = {});
  // Where a TCP store is served ("127.0.0.1:41234"), or the file store's directory.
  std::string address() const;

 private:
  explicit Store(std::shared_ptr<detail::StoreImpl> impl);
  std::shared_ptr<detail::StoreImpl> impl_;
};

}  // namespace anview
