// Thread-per-rank test harness (Gloo's tests/base_test.h style): N communicators in one
// process, bootstrapped through a TCP store on loopback, each driven by its own thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "anview/anview.hpp"

namespace anview::testing {

// Runs fn(comm) on `ranks` threads; rethrows the first exception any rank raised.
// `host_of(rank)`, when given, names each rank's emulated host (CommunicatorOptions::host_id);
// `timeout_of(rank)`, each rank's communicator timeout (else `timeout`, the store's too).
inline void run_ranks(int ranks, const std::function<void(Communicator&)>& fn,
                      std::chrono::milliseconds timeout = std::chrono::seconds(20),
                      const std::function<std::string(int)>& host_of = nullptr,
                      const std::function<std::chrono::milliseconds(int)>& timeout_of = nullptr) {
  static std::atomic<int> generation{0};
  const std::string prefix = "test" + std::to_string(generation++);
  Store server = Store::serve_tcp("127.0.0.1:0", {.timeout = timeout});
  const std::string address = server.address();
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  std::vector<std::jthread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        Store store = Store::connect_tcp(address, {.timeout = timeout, .rank = r});
        Communicator comm = Communicator::create(r, ranks, store,
                                                 {.timeout = timeout_of ? timeout_of(r) : timeout,
                                                  .store_prefix = prefix,
                                                  .host_id = host_of ? host_of(r) : ""});
        fn(comm);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// A payload pattern that differs per (sender, message, byte).
inline unsigned char pattern_byte(int sender, std::uint64_t message, std::size_t index) {
  return static_cast<unsigned char>(
      (index * 31 + message * 17 + static_cast<std::size_t>(sender) * 101 + 3) & 0xff);
}

inline std::vector<unsigned char> make_payload(int sender, std::uint64_t message,
                                               std::size_t bytes) {
  std::vector<unsigned char> v(bytes);
  for (std::size_t i = 0; i < bytes; ++i) v[i] = pattern_byte(sender, message, i);
  return v;
}

inline bool payload_ok(const unsigned char* data, int sender, std::uint64_t message,
                       std::size_t bytes) {
  for (std::size_t i = 0; i < bytes; ++i)
    if (data[i] != pattern_byte(sender, message, i)) return false;
  return true;
}

}  // namespace anview::testing
