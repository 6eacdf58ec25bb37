#include "one_sided.hpp"

#include <algorithm>
#include <chrono>

#include "buffer.hpp"

namespace perf {
namespace {

using Clock = std::chrono::steady_clock;
constexpr anview::Tag done_tag{3};

unsigned char pattern(std::size_t k, long i) {
  return static_cast<unsigned char>((k * 131 + static_cast<std::size_t>(i) * 7 + 1) & 0xff);
}

}  // namespace

int one_sided_window(std::size_t bytes) {
  return static_cast<int>(
      std::clamp<std::size_t>((256u << 20) / std::max<std::size_t>(bytes, 1), 2, 64));
}

OneSidedResult measure_one_sided(anview::Communicator& comm, const OneSidedRun& run,
                                 const anview::RemoteKey& target, unsigned char* region) {
  OneSidedResult result;
  const std::size_t bytes = run.bytes;
  const int window = run.window;
  char token = 0;
  if (comm.rank() == 1) {
    // The target: nothing to do but wait for the end (its progress serves emulated paths).
    if (run.check && !run.put)
      for (std::size_t k = 0; k < bytes; ++k) region[k] = pattern(k, 0);
    comm.send(&token, 1, 0, done_tag);  // ready
    comm.recv(&token, 1, 0, done_tag);  // done
    if (run.check && run.put)
      for (std::size_t k = 0; k < bytes; ++k)
        if (region[k] != pattern(k, run.iters - 1)) {
          ++result.wrong;
          break;
        }
    return result;
  }
  Buffer<unsigned char> local(std::max<std::size_t>(bytes, 1), run.huge_pages);
  comm.recv(&token, 1, 1, done_tag);
  std::vector<anview::Request> ops;
  ops.reserve(static_cast<std::size_t>(window));
  auto run_window = [&](long first) {
    ops.clear();
    for (int w = 0; w < window; ++w) {
      if (run.put) {
        if (run.check)
          for (std::size_t k = 0; k < bytes; ++k) local[k] = pattern(k, first + w);
        ops.push_back(comm.put(local.data(), bytes, target));
        if (run.check) ops.back().wait();  // the pattern changes with the next one
      } else {
        ops.push_back(comm.get(local.data(), bytes, target));
      }
    }
    if (run.put) {
      comm.flush(1).wait();
    } else {
      for (auto& op : ops) op.wait();
    }
    for (auto& op : ops) op.wait();  // every one complete (errors raised)
  };
  for (long i = 0; i < run.warmup; i += window) run_window(i - run.warmup);
  const auto t0 = Clock::now();
  for (long i = 0; i < run.iters; i += window) {
    const auto w0 = Clock::now();
    run_window(i);
    result.per_window_us.push_back(
        std::chrono::duration<double, std::micro>(Clock::now() - w0).count() / window);
  }
  result.total_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  if (run.check && !run.put)
    for (std::size_t k = 0; k < bytes; ++k)
      if (local[k] != pattern(k, 0)) {
        ++result.wrong;
        break;
      }
  comm.send(&token, 1, 1, done_tag);
  return result;
}

}  // namespace perf
