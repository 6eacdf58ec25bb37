// anview_lab_incast: ranks 1..N-1 each send `--messages` messages of `--bytes` to rank 0 at
// once (incast, as into a parameter server or a gather), while rank 1 also ping-pongs 8 bytes
// with rank 0 on another tag. Run in the lab with every rank on its own emulated host and
// rank 0's link rate-limited, by the incast test and scripts/bench_multipath.py.
//
// Rank 0 checks every byte it receives and prints `RESULT {json}` with the aggregate rate;
// rank 1 adds the ping round trips (count, p50, p99, max in microseconds). An anview::Error
// ends a rank with exit code 3 and its message on stderr.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "anview/anview.hpp"

namespace {

using Clock = std::chrono::steady_clock;
constexpr anview::Tag bulk_tag{3};
constexpr anview::Tag ping_tag{4};

std::uint64_t word(int sender, int message, std::size_t index) {
  std::uint64_t z = (static_cast<std::uint64_t>(sender) << 40) ^
                    (static_cast<std::uint64_t>(message) << 20) ^ (index * 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  return z ^ (z >> 27);
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"anview_lab_incast: many senders into rank 0, with a concurrent ping"};
  std::size_t bytes = 4u << 20;
  int messages = 16;
  app.add_option("--bytes", bytes, "bytes per message (a multiple of 8)")
      ->check(CLI::Range(std::size_t{8}, std::size_t{1} << 30));
  app.add_option("--messages", messages, "messages per sender")->check(CLI::Range(1, 1 << 20));
  CLI11_PARSE(app, argc, argv);
  bytes -= bytes % 8;
  const std::size_t words = bytes / 8;
  try {
    anview::Communicator comm = anview::Communicator::from_env();
    const int rank = comm.rank();
    const int size = comm.size();
    if (size < 3) {
      std::fprintf(stderr, "anview_lab_incast: needs at least 3 ranks\n");
      return 2;
    }
    const auto timeout = std::chrono::seconds(120);
    std::uint64_t ping = 0;
    comm.barrier();
    const auto start = Clock::now();
    nlohmann::json result = {{"rank", rank}};
    if (rank == 0) {
      // One receive posted per sender at a time; pings answered as they come.
      std::vector<std::vector<std::uint64_t>> buffers(static_cast<std::size_t>(size),
                                                      std::vector<std::uint64_t>(words));
      std::vector<std::optional<anview::Request>> recvs(static_cast<std::size_t>(size));
      std::vector<int> received(static_cast<std::size_t>(size), 0);
      for (int s = 1; s < size; ++s) recvs[s] = comm.irecv(buffers[s].data(), bytes, s, bulk_tag);
      anview::Request ping_recv = comm.irecv(&ping, sizeof ping, 1, ping_tag);
      int pending = size - 1;
      while (pending > 0) {
        if (ping_recv.test()) {
          comm.isend(&ping, sizeof ping, 1, ping_tag).wait(timeout);
          ping_recv = comm.irecv(&ping, sizeof ping, 1, ping_tag);
        }
        for (int s = 1; s < size; ++s) {
          if (!recvs[s] || !recvs[s]->test()) continue;
          recvs[s]->wait(timeout);  // raises its error, if any
          const int m = received[s]++;
          for (std::size_t i = 0; i < words; ++i) {
            if (buffers[s][i] != word(s, m, i)) {
              std::fprintf(stderr, "anview_lab_incast: message %d of rank %d differs at %zu\n", m,
                           s, i * 8);
              return 1;
            }
          }
          if (received[s] < messages) {
            recvs[s] = comm.irecv(buffers[s].data(), bytes, s, bulk_tag);
          } else {
            recvs[s].reset();
            --pending;
          }
        }
        comm.progress();
      }
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      const double total = static_cast<double>(bytes) * messages * (size - 1);
      result["seconds"] = seconds;
      result["bytes"] = total;
      result["mbit_per_s"] = total * 8 / seconds / 1e6;
      // The last ping stays posted: tell rank 1 the bulk is over with a final answer.
      ping_recv.wait(timeout);
      ping = ~std::uint64_t{0};
      comm.isend(&ping, sizeof ping, 1, ping_tag).wait(timeout);
    } else {
      std::vector<std::uint64_t> buffer(words);
      std::vector<double> rtts;
      int sent = 0;
      std::optional<anview::Request> send;
      auto next_send = [&] {
        for (std::size_t i = 0; i < words; ++i) buffer[i] = word(rank, sent, i);
        send = comm.isend(buffer.data(), bytes, 0, bulk_tag);
        ++sent;
      };
      next_send();
      bool pinging = rank == 1;
      while (send || pinging) {
        if (pinging) {
          const auto t0 = Clock::now();
          std::uint64_t out = rtts.size(), in = 0;
          comm.isend(&out, sizeof out, 0, ping_tag).wait(timeout);
          comm.irecv(&in, sizeof in, 0, ping_tag).wait(timeout);
          if (in == ~std::uint64_t{0}) {
            pinging = false;  // rank 0 has every message
          } else {
            rtts.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
          }
        }
        if (send && send->test()) {
          send->wait(timeout);
          send.reset();
          if (sent < messages) next_send();
        }
        if (!pinging && send) send->wait(timeout);
      }
      if (rank == 1) {
        result["pings"] = rtts.size();
        result["ping_p50_us"] = quantile(rtts, 0.5);
        result["ping_p99_us"] = quantile(rtts, 0.99);
        result["ping_max_us"] = rtts.empty() ? 0 : *std::max_element(rtts.begin(), rtts.end());
      }
    }
    comm.barrier();
    std::printf("RESULT %s\n", result.dump().c_str());
    std::fflush(stdout);
    return 0;
  } catch (const anview::Error& e) {
    std::fprintf(stderr, "anview_lab_incast: %s\n", e.what());
    return 3;
  }
}
