// anview_lab_transfer: rank 0 sends `--messages` messages of `--bytes` each to rank 1, which
// checks every byte (a pattern that differs per message and per word). Run by the lab tests
// and the multi-path benchmark (scripts/bench_multipath.py) with one rank per emulated host.
//
// Each rank prints one line `RESULT {json}`: seconds, throughput, the longest gap between two
// messages arriving (the stall a path failure costs), the peer's transport description and
// the per-path metrics (anview_tcp_path_*). With --settle SEC, both ranks afterwards wait up
// to SEC for every path to be up again (a failed path re-admitted) before reporting. An
// anview::Error ends the rank with exit code 3 and its message on stderr.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "anview/anview.hpp"
#include "anview/metrics.hpp"

namespace {

using Clock = std::chrono::steady_clock;

std::uint64_t word(std::uint64_t message, std::uint64_t index) {
  std::uint64_t z = message * 0x9E3779B97F4A7C15ull + index + 1;  // splitmix64
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void fill(std::vector<std::uint64_t>& buffer, std::uint64_t message) {
  for (std::size_t i = 0; i < buffer.size(); ++i) buffer[i] = word(message, i);
}

// Index of the first wrong word, or -1.
long long first_mismatch(const std::vector<std::uint64_t>& buffer, std::uint64_t message) {
  for (std::size_t i = 0; i < buffer.size(); ++i)
    if (buffer[i] != word(message, i)) return static_cast<long long>(i);
  return -1;
}

nlohmann::json path_metrics() {
  nlohmann::json out = nlohmann::json::array();
  const auto all = nlohmann::json::parse(anview::metrics_json());
  for (const auto& sample : all["metrics"]) {
    const std::string name = sample.value("name", "");
    if (name.rfind("anview_tcp_path_", 0) == 0) out.push_back(sample);
  }
  return out;
}

bool every_path_up(const nlohmann::json& metrics) {
  bool any = false;
  for (const auto& sample : metrics) {
    if (sample["name"] != "anview_tcp_path_up") continue;
    any = true;
    if (sample["value"].get<double>() != 1.0) return false;
  }
  return any;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"anview_lab_transfer: a checked bulk transfer from rank 0 to rank 1"};
  std::uint64_t bytes = 64u << 20;
  int messages = 4;
  double settle = 0;
  app.add_option("--bytes", bytes, "bytes per message (a multiple of 8)")
      ->check(CLI::Range(8ull, 1ull << 32));
  app.add_option("--messages", messages, "messages to send")->check(CLI::Range(1, 1 << 20));
  app.add_option("--settle", settle, "wait up to this many seconds for every path to be up");
  CLI11_PARSE(app, argc, argv);
  bytes -= bytes % 8;
  try {
    anview::Communicator comm = anview::Communicator::from_env();
    if (comm.size() != 2) {
      std::fprintf(stderr, "anview_lab_transfer: needs 2 ranks, got %d\n", comm.size());
      return 2;
    }
    const int rank = comm.rank();
    const int peer = 1 - rank;
    const auto timeout = std::chrono::seconds(120);
    std::vector<std::uint64_t> buffer(bytes / 8);
    comm.barrier();
    const auto start = Clock::now();
    auto last = start;
    double max_gap_ms = 0;
    for (int m = 0; m < messages; ++m) {
      if (rank == 0) {
        fill(buffer, static_cast<std::uint64_t>(m));
        comm.isend(buffer.data(), bytes, peer, anview::Tag{7}).wait(timeout);
      } else {
        std::memset(buffer.data(), 0, bytes);
        comm.irecv(buffer.data(), bytes, peer, anview::Tag{7}).wait(timeout);
        const auto now = Clock::now();
        max_gap_ms =
            std::max(max_gap_ms, std::chrono::duration<double, std::milli>(now - last).count());
        last = now;
        if (const long long bad = first_mismatch(buffer, static_cast<std::uint64_t>(m)); bad >= 0) {
          std::fprintf(stderr, "anview_lab_transfer: message %d differs at byte %lld\n", m,
                       bad * 8);
          return 1;
        }
      }
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    comm.barrier();
    auto metrics = path_metrics();
    if (settle > 0) {
      // Both ranks stay (a rank that leaves closes the link) until each sees every path up.
      const auto deadline = Clock::now() + std::chrono::duration<double>(settle);
      while (!every_path_up(metrics) && Clock::now() < deadline) {
        for (int i = 0; i < 100; ++i) comm.progress();
        metrics = path_metrics();
      }
      comm.barrier();
    }
    const double total = static_cast<double>(bytes) * messages;
    nlohmann::json result = {{"rank", rank},
                             {"bytes", total},
                             {"seconds", seconds},
                             {"gbit_per_s", total * 8 / seconds / 1e9},
                             {"max_gap_ms", max_gap_ms},
                             {"checked", rank == 1},
                             {"peer", comm.describe_peer(peer)},
                             {"paths", metrics}};
    std::printf("RESULT %s\n", result.dump().c_str());
    std::fflush(stdout);
    return 0;
  } catch (const anview::Error& e) {
    std::fprintf(stderr, "anview_lab_transfer: %s\n", e.what());
    return 3;
  }
}
