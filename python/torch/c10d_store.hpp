// PyTorch's c10d store (TCPStore, FileStore, PrefixStore, ...) as an anview::StoreBackend: the
// backend bootstraps its communicator through the store torch gives it, nothing else.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <string>
#include <utility>
#include <vector>

#include "anview/store.hpp"

namespace anview::torch_backend {

class C10dStore final : public StoreBackend {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const Bytes& value) override { store_->set(key, value); }
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override {
    store_->wait({key}, timeout);
    return store_->get(key);
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    return store_->add(key, delta);
  }
  bool check(const std::vector<std::string>& keys) override { return store_->check(keys); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    store_->wait(keys, timeout);
  }
  std::string address() const override { return "the c10d store"; }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace anview::torch_backend
