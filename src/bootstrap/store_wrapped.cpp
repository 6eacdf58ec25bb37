// A store kept by someone else (anview::StoreBackend), behind the StoreImpl interface: the
// backend's own exceptions become anview::Error naming the call and its keys.
#include <exception>
#include <string_view>
#include <utility>

#include "anview/error.hpp"
#include "bootstrap/store_impl.hpp"

namespace anview::detail {
namespace {

class WrappedStore final : public StoreImpl {
 public:
  WrappedStore(std::shared_ptr<StoreBackend> backend, const StoreOptions& options)
      : StoreImpl(options), backend_(std::move(backend)) {}

  void set(const std::string& key, const std::uint8_t* data, std::size_t size, Timeout) override {
    guarded("store.set", {key}, [&] { backend_->set(key, Bytes(data, data + size)); });
  }

  Bytes get(const std::string& key, Timeout timeout) override {
    Bytes value;
    guarded("store.get", {key}, [&] { value = backend_->get(key, timeout); });
    return value;
  }

  std::int64_t add(const std::string& key, std::int64_t delta, Timeout) override {
    std::int64_t value = 0;
    guarded("store.add", {key}, [&] { value = backend_->add(key, delta); });
    return value;
  }

  bool check(const std::vector<std::string>& keys, Timeout) override {
    bool present = false;
    guarded("store.check", keys, [&] { present = backend_->check(keys); });
    return present;
  }

  void wait(const std::vector<std::string>& keys, Timeout timeout) override {
    guarded("store.wait", keys, [&] { backend_->wait(keys, timeout); });
  }

  std::string address() const override { return backend_->address(); }

 private:
  // Runs `call`; an anview::Error passes unchanged, anything else becomes one. A backend
  // cannot say whether it timed out other than in its message, so the message decides.
  template <typename Call>
  void guarded(const char* operation, const std::vector<std::string>& keys, Call&& call) {
    try {
      call();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      const std::string_view what = e.what();
      const bool timed_out = what.find("imeout") != std::string_view::npos ||
                             what.find("imed out") != std::string_view::npos;
      throw Error(timed_out ? ErrorKind::timeout : ErrorKind::link,
                  {.rank = options().rank,
                   .peer_address = backend_->address(),
                   .operation = operation,
                   .cause = "the wrapped store failed on " + describe_keys(keys) + ": " +
                            std::string(what.substr(0, 2000))});
    }
  }

  std::shared_ptr<StoreBackend> backend_;
};

}  // namespace

std::shared_ptr<StoreImpl> wrap_store(std::shared_ptr<StoreBackend> backend,
                                      const StoreOptions& options) {
  return std::make_shared<WrappedStore>(std::move(backend), options);
}

}  // namespace anview::detail
