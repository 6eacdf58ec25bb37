// Store::wrap: a store kept by someone else (as PyTorch's c10d store is for the torch backend)
// behind the anview::Store handle, and a communicator bootstrapped over it.
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "anview/anview.hpp"
#include "support/expect_error.hpp"
#include "support/test_thread.hpp"

namespace anview {
namespace {

using namespace std::chrono_literals;
using testing::test_thread;

// An in-memory backend; `fail_with` makes every call throw that message instead.
class MapBackend final : public StoreBackend {
 public:
  void set(const std::string& key, const Bytes& value) override {
    maybe_fail();
    std::lock_guard lock(mutex_);
    values_[key] = value;
    changed_.notify_all();
  }
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override {
    wait({key}, timeout);
    std::lock_guard lock(mutex_);
    return values_.at(key);
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    maybe_fail();
    std::lock_guard lock(mutex_);
    auto& value = values_[key];
    const std::int64_t next =
        (value.empty() ? 0 : std::stoll(std::string(value.begin(), value.end()))) + delta;
    const std::string text = std::to_string(next);
    value.assign(text.begin(), text.end());
    changed_.notify_all();
    return next;
  }
  bool check(const std::vector<std::string>& keys) override {
    maybe_fail();
    std::lock_guard lock(mutex_);
    for (const auto& k : keys)
      if (!values_.contains(k)) return false;
    return true;
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    maybe_fail();
    std::unique_lock lock(mutex_);
    const bool present = changed_.wait_for(lock, timeout, [&] {
      for (const auto& k : keys)
        if (!values_.contains(k)) return false;
      return true;
    });
    if (!present)
      throw std::runtime_error("Wait timeout after " + std::to_string(timeout.count()) + "ms");
  }
  std::string address() const override { return "map store"; }

  std::string fail_with;
  std::size_t stored_keys() {
    std::lock_guard lock(mutex_);
    return values_.size();
  }

 private:
  void maybe_fail() const {
    if (!fail_with.empty()) throw std::runtime_error(fail_with);
  }
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, Bytes> values_;
};

using testing::expect_error;

TEST(WrappedStore, ForwardsEveryCall) {
  auto backend = std::make_shared<MapBackend>();
  Store store = Store::wrap(backend, {.timeout = 2s, .rank = 3});
  store.set("k", std::string("v"));
  EXPECT_EQ(store.get_string("k"), "v");
  EXPECT_EQ(store.add("n", 5), 5);
  EXPECT_EQ(store.add("n", -2), 3);
  EXPECT_TRUE(store.check({"k", "n"}));
  EXPECT_FALSE(store.check({"k", "missing"}));
  std::jthread late = test_thread([&] {
    std::this_thread::sleep_for(50ms);
    backend->set("late", {1, 2});
  });
  store.wait({"late"});
  EXPECT_EQ(store.get("late"), (Store::Bytes{1, 2}));
  late.join();
  EXPECT_EQ(store.address(), "map store");
}

TEST(WrappedStore, BackendFailuresBecomeErrorsNamingTheCall) {
  auto backend = std::make_shared<MapBackend>();
  Store store = Store::wrap(backend, {.timeout = 100ms, .rank = 2});
  const Error timeout = expect_error([&] { store.get("never"); });
  EXPECT_EQ(timeout.kind(), ErrorKind::timeout) << timeout.what();
  EXPECT_EQ(timeout.operation(), "store.get");
  EXPECT_EQ(timeout.rank(), 2);
  EXPECT_NE(timeout.cause().find("'never'"), std::string::npos) << timeout.what();
  EXPECT_NE(timeout.cause().find("Wait timeout"), std::string::npos) << timeout.what();

  backend->fail_with = "Connection reset by peer";
  const Error link = expect_error([&] { store.add("n", 1); });
  EXPECT_EQ(link.kind(), ErrorKind::link) << link.what();
  EXPECT_EQ(link.operation(), "store.add");
  EXPECT_EQ(link.context().peer_address, "map store");
}

TEST(WrappedStore, ArgumentsAreCheckedBeforeTheBackend) {
  auto backend = std::make_shared<MapBackend>();
  Store store = Store::wrap(backend, {.timeout = 100ms});
  EXPECT_EQ(expect_error([&] { store.set("", std::string("x")); }).kind(), ErrorKind::usage);
  EXPECT_EQ(expect_error([&] { store.set(std::string(5000, 'k'), std::string("x")); }).kind(),
            ErrorKind::usage);
  EXPECT_EQ(backend->stored_keys(), 0u);
  EXPECT_EQ(expect_error([] { Store::wrap(nullptr); }).kind(), ErrorKind::usage);
}

TEST(WrappedStore, CommunicatorsBootstrapOverIt) {
  auto backend = std::make_shared<MapBackend>();
  constexpr int ranks = 3;
  std::vector<std::jthread> threads;
  std::vector<std::string> failures(ranks);
  std::vector<float> sums(ranks);
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        Communicator comm = Communicator::create(
            r, ranks, Store::wrap(backend, {.timeout = 20s, .rank = r}), {.timeout = 20s});
        float value = static_cast<float>(r + 1);
        comm.allreduce(&value, 1, DataType::float32, ReduceOp::sum);
        sums[static_cast<std::size_t>(r)] = value;
      } catch (const std::exception& e) {
        failures[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) {
    EXPECT_EQ(failures[static_cast<std::size_t>(r)], "") << "rank " << r;
    EXPECT_EQ(sums[static_cast<std::size_t>(r)], 6.0f) << "rank " << r;
  }
}

}  // namespace
}  // namespace anview
