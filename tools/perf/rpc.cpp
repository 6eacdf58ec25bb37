#include "rpc.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "rank_pair.hpp"
#include "sweep.hpp"

namespace perf {
namespace {

using Clock = std::chrono::steady_clock;

struct CaseResult {
  long calls = 0;
  long wrong = 0;
  std::vector<double> latency_us;
};

// One client thread keeps `window` calls in flight until `end`; counts and times the calls that
// complete after `measure_from`.
void client_thread(anview::RpcClient& client, const std::vector<std::byte>& payload, int window,
                   Clock::time_point measure_from, Clock::time_point end, bool check,
                   CaseResult& out) {
  std::deque<std::pair<anview::RpcCall, Clock::time_point>> inflight;
  for (;;) {
    const auto now = Clock::now();
    while (now < end && static_cast<int>(inflight.size()) < window)
      inflight.emplace_back(
          client.call("echo", anview::Message::view(payload.data(), payload.size())), Clock::now());
    if (inflight.empty()) return;
    const anview::Message reply = inflight.front().first.get();
    const auto done = Clock::now();
    if (done >= measure_from && done < end) {
      ++out.calls;
      out.latency_us.push_back(
          std::chrono::duration<double, std::micro>(done - inflight.front().second).count());
    }
    if (check && (reply.size() != payload.size() ||
                  std::memcmp(reply.bytes().data(), payload.data(), payload.size()) != 0))
      ++out.wrong;
    inflight.pop_front();
  }
}

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  const auto k = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
  return v[k];
}

long measure(const std::string& address, const RpcOptions& o) {
  anview::RpcClient client = anview::RpcClient::connect(address);
  if (!o.json) {
    std::printf("# anview-perf rpc: echo to %s over %s, %d client thread(s), %.1f s per case\n",
                address.c_str(), "a connection of its own", o.threads, o.seconds);
    std::printf("%12s %6s %12s %12s %12s %10s\n", "size", "conc", "qps", "p50_us", "p99_us",
                "#wrong");
  }
  long wrong = 0;
  for (int conc : o.concurrency) {
    for (std::size_t bytes : o.sizes) {
      std::vector<std::byte> payload(bytes);
      for (std::size_t i = 0; i < bytes; ++i) payload[i] = static_cast<std::byte>(i * 7 + 1);
      const int threads = std::max(1, std::min(o.threads, conc));
      const auto start = Clock::now();
      const auto measure_from = start + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(o.warmup));
      const auto end = measure_from + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(o.seconds));
      std::vector<CaseResult> results(static_cast<std::size_t>(threads));
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t) {
        const int window = conc / threads + (t < conc % threads ? 1 : 0);
        pool.emplace_back([&, t, window] {
          client_thread(client, payload, window, measure_from, end, o.check,
                        results[static_cast<std::size_t>(t)]);
        });
      }
      for (auto& th : pool) th.join();
      CaseResult all;
      for (auto& r : results) {
        all.calls += r.calls;
        all.wrong += r.wrong;
        all.latency_us.insert(all.latency_us.end(), r.latency_us.begin(), r.latency_us.end());
      }
      wrong += all.wrong;
      const double qps = static_cast<double>(all.calls) / o.seconds;
      const double p50 = percentile(all.latency_us, 0.50);
      const double p99 = percentile(all.latency_us, 0.99);
      if (o.json) {
        nlohmann::json j{{"op", "rpc"},        {"bytes", bytes},     {"concurrency", conc},
                         {"threads", threads}, {"qps", qps},         {"lat_us_p50", p50},
                         {"lat_us_p99", p99},  {"calls", all.calls}, {"wrong", all.wrong}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("%12s %6d %12.0f %12.2f %12.2f %10ld\n", human_size(bytes).c_str(), conc, qps,
                    p50, p99, all.wrong);
      }
      std::fflush(stdout);
    }
  }
  return wrong;
}

}  // namespace

long run_rpc(anview::Communicator& comm, const RpcOptions& o) {
  long wrong = 0;
  std::string address;
  std::optional<anview::RpcServer> server;
  if (comm.rank() == 0) {
    server = anview::RpcServer::listen(o.listen, {.handler_threads = o.handler_threads});
    server->add_method("echo", [](const anview::CallContext&, const anview::Message& request) {
      return request;  // sent back from the buffer it arrived in
    });
    address = server->address();
  }
  address = share_address(comm, address);
  if (comm.rank() == 1) wrong = measure(address, o);
  wrong = share_verdict(comm, wrong, 1);
  if (server) server->shutdown();
  return wrong;
}

}  // namespace perf
