#include "collectives/tuning.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "base/config.hpp"
#include "base/cpus.hpp"
#include "base/log.hpp"
#include "collectives/reduce.hpp"
#include "collectives/steps.hpp"

namespace anview::collectives {
namespace {

const base::Setting tuning_file_setting(
    "collectives", "ANVIEW_TUNING_FILE", "",
    "The tuner's measured costs are read from this file when it holds values for the same "
    "ranks and placement, else measured at the first collective and written there by rank 0 "
    "(default: measured by every run)");

constexpr int small_warmup = 8;
constexpr int small_rounds = 64;
constexpr int large_rounds = 3;
constexpr int alpha_blocks = 6;
constexpr std::size_t large_bytes = std::size_t{1} << 20;
// Local copies and reductions are timed beyond the caches: large collectives are memory-bound,
// and small ones cost little either way.
constexpr std::size_t local_bytes = std::size_t{8} << 20;
constexpr int file_version = 1;

// The values every rank measures, each "bigger is worse", so one max over the ranks gives the
// costs of the slowest link and the slowest rank, which set the pace of a collective.
enum Field {
  alpha_us,
  us_per_link_byte,
  us_per_read_byte,
  read_us,
  us_per_reduce_byte,
  us_per_copy_byte,
  flag_us,
  local_alpha_us,
  us_per_local_link_byte,
  crowding,
  fields
};
using Values = std::array<double, fields>;

// `rounds` timings of `step`, in microseconds.
template <typename Step>
std::vector<double> timed_us(int rounds, Step&& step) {
  std::vector<double> times;
  for (int i = 0; i < rounds; ++i) {
    const auto start = std::chrono::steady_clock::now();
    step();
    times.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count());
  }
  return times;
}

template <typename Step>
double median_us(int rounds, Step&& step) {
  std::vector<double> times = timed_us(rounds, step);
  std::nth_element(times.begin(), times.begin() + rounds / 2, times.end());
  return times[static_cast<std::size_t>(rounds / 2)];
}

// The fastest of `rounds`: a rank's own work at full speed, which the cost model slows by the
// crowding of its host (a median would catch a rank kept off its CPU by another now and then).
template <typename Step>
double fastest_us(int rounds, Step&& step) {
  const std::vector<double> times = timed_us(rounds, step);
  return *std::min_element(times.begin(), times.end());
}

// Ranks of this rank's host per CPU this process may run on, at least 1.
double host_crowding(const Call& call, const HostLayout* layout) {
  std::size_t ranks = static_cast<std::size_t>(call.size);
  if (layout != nullptr && !layout->hosts.empty()) {
    const auto me = static_cast<std::size_t>(call.rank);
    ranks = layout->hosts[static_cast<std::size_t>(layout->host_of[me])].size();
  }
  const int cpus = base::usable_cpus();
  return cpus > 0 ? std::max(1.0, static_cast<double>(ranks) / cpus) : 1.0;
}

// Microseconds per byte of a large_bytes message to the right neighbour while one comes from
// the left, as in a ring step. Its latency is `alpha_us`, three times over where the message
// goes by rendezvous (request-to-send and clear-to-send first), as the cost model counts it.
// `out` and `in` hold large_bytes.
double link_us_per_byte(Call& call, const char* out, char* in, double alpha_us) {
  const int right = mod(call.rank + 1, call.size);
  const int left = mod(call.rank - 1, call.size);
  auto large = [&] { sendrecv(call, out, large_bytes, right, in, large_bytes, left); };
  large();
  const double latency = large_bytes > call.messenger.eager_bytes() ? 3 * alpha_us : alpha_us;
  return std::max(median_us(large_rounds, large) - latency, 1e-3) /
         static_cast<double>(large_bytes);
}

// When the job spans hosts, the ranks of each host also time their own links (a ring among
// them), which hierarchical algorithms use inside a host. Ranks alone on their host skip it.
void measure_inside_host(Call& call, const Placement& where, char* out, char* in, Values& v) {
  const HostLayout& layout = *where.layout;
  const auto me = static_cast<std::size_t>(call.rank);
  const auto& host = layout.hosts[static_cast<std::size_t>(layout.host_of[me])];
  if (host.size() < 2) return;
  Call local = call.among(host, layout.position[me]);
  const int right = mod(local.rank + 1, local.size);
  const int left = mod(local.rank - 1, local.size);
  auto small = [&] { sendrecv(local, out, 8, right, in, 8, left); };
  for (int i = 0; i < small_warmup; ++i) small();
  v[local_alpha_us] = median_us(small_rounds, small);
  v[us_per_local_link_byte] = link_us_per_byte(local, out, in, v[local_alpha_us]);
}

// Messages go to the right neighbour while others come from the left one, as in a ring step.
// Returns the values agreed by every rank (the worst of each).
Values measure(Call& call, const Placement& where, std::uint64_t& shared_calls) {
  const int right = mod(call.rank + 1, call.size);
  const int left = mod(call.rank - 1, call.size);
  Values v{};
  // alpha: a dissemination barrier takes ceil(log2 p) rounds of one message each way. Timing
  // whole barriers (not one pair's ping-pong) charges what a collective pays when ranks share
  // cores: waiting for every rank to be scheduled.
  // On this shared machine a rank is now and then kept off its core for a few milliseconds
  // (the ranks just started, or a neighbour's burst): each message then costs a wake-up,
  // ~60 us instead of ~1.5, and a probe caught in it made alpha 40x too high for the whole
  // job (one start in ten). So alpha is timed in blocks spread over ~15 ms (sleeps of 1, 2,
  // ... ms between them), and the best block's median stands for the job; in 20 starts every
  // such episode spanned at most three blocks. Where ranks do outnumber the cores, every
  // block is slow, and so is alpha.
  int rounds = 0;
  while ((1 << rounds) < call.size) ++rounds;
  double best = 0;
  for (int block = 0; block < alpha_blocks; ++block) {
    if (block > 0) std::this_thread::sleep_for(std::chrono::milliseconds(block));
    for (int i = 0; i < small_warmup / 2; ++i) barrier_dissemination(call);
    const double us = median_us(small_rounds / alpha_blocks, [&] { barrier_dissemination(call); });
    best = block == 0 ? us : std::min(best, us);
  }
  v[alpha_us] = best / rounds;
  std::vector<char> out_large(large_bytes, 1), in_large(large_bytes);
  v[us_per_link_byte] = link_us_per_byte(call, out_large.data(), in_large.data(), v[alpha_us]);
  if (where.peers != nullptr) {
    // Read the right neighbour's buffer as the direct algorithms do (its address comes in a
    // message); nobody leaves before the agreement below, so the buffer outlives the reads.
    const auto mine = reinterpret_cast<std::uintptr_t>(out_large.data());
    std::uint64_t address = mine, theirs = 0;
    sendrecv(call, &address, sizeof address, left, &theirs, sizeof theirs, right);
    const transport::PeerMemory& peer = *(*where.peers)[static_cast<std::size_t>(right)];
    const std::string operation = call.operation();
    auto read = [&] { peer.read(theirs, in_large.data(), large_bytes, operation); };
    read();
    v[us_per_read_byte] = fastest_us(large_rounds, read) / static_cast<double>(large_bytes);
    // The direct algorithms make a call per peer and chunk: a small read is its fixed cost.
    auto small_read = [&] { peer.read(theirs, in_large.data(), 8, operation); };
    for (int i = 0; i < small_warmup; ++i) small_read();
    v[read_us] = median_us(small_rounds, small_read);
  }
  std::vector<float> into(local_bytes / sizeof(float), 1.0f), from(into.size(), 0.5f);
  const auto local = static_cast<double>(local_bytes);
  v[us_per_reduce_byte] = fastest_us(large_rounds,
                                     [&] {
                                       reduce_into(into.data(), from.data(), into.size(),
                                                   DataType::float32, ReduceOp::sum);
                                     }) /
                          local;
  v[us_per_copy_byte] =
      fastest_us(large_rounds, [&] { std::memcpy(into.data(), from.data(), local_bytes); }) / local;
  v[crowding] = host_crowding(call, where.layout);
  if (where.layout != nullptr && where.layout->hosts.size() > 1)
    measure_inside_host(call, where, out_large.data(), in_large.data(), v);
  if (where.areas != nullptr) {
    auto flags = [&] { barrier_shared(call, *where.areas, ++shared_calls); };
    for (int i = 0; i < small_warmup; ++i) flags();
    v[flag_us] = median_us(small_rounds, flags);
  }
  allreduce_recursive_doubling(call, v.data(), v.size(), DataType::float64, ReduceOp::max);
  return v;
}

CostModel to_model(const Values& v, std::string source) {
  CostModel m;
  m.alpha_us = v[alpha_us];
  m.link_bpus = 1 / std::max(v[us_per_link_byte], 1e-9);
  m.read_bpus = v[us_per_read_byte] > 0 ? 1 / v[us_per_read_byte] : 0;
  m.read_us = v[read_us];
  m.reduce_bpus = 1 / std::max(v[us_per_reduce_byte], 1e-9);
  m.copy_bpus = 1 / std::max(v[us_per_copy_byte], 1e-9);
  m.flag_us = v[flag_us];
  m.crowding = std::max(v[crowding], 1.0);
  m.local_alpha_us = v[local_alpha_us];
  m.local_link_bpus = v[us_per_local_link_byte] > 0 ? 1 / v[us_per_local_link_byte] : 0;
  m.source = std::move(source);
  return m;
}

// Rank 0's view of the file: the values when they were written for this job's ranks and
// placement, else nothing (with a warning when the file exists but does not fit).
bool read_file(const std::string& path, int ranks, int placement, Values& v) {
  std::ifstream in(path);
  if (!in) return false;
  try {
    const auto j = nlohmann::json::parse(in);
    if (j.at("version").get<int>() != file_version || j.at("ranks").get<int>() != ranks ||
        j.at("placement").get<int>() != placement) {
      base::log("coll", base::LogLevel::warn, "tuning file ", path, " was written for ",
                j.at("ranks").get<int>(), " ranks, placement ", j.at("placement").get<int>(),
                "; this job has ", ranks, " ranks, placement ", placement,
                ": measuring again and rewriting it");
      return false;
    }
    v[alpha_us] = j.at("alpha_us").get<double>();
    v[us_per_link_byte] = 1e-3 / j.at("link_gbs").get<double>();
    const double read_gbs = j.at("read_gbs").get<double>();
    v[us_per_read_byte] = read_gbs > 0 ? 1e-3 / read_gbs : 0;
    v[read_us] = j.value("read_us", 0.0);  // files of before it was measured: none
    v[us_per_reduce_byte] = 1e-3 / j.at("reduce_gbs").get<double>();
    v[us_per_copy_byte] = 1e-3 / j.at("copy_gbs").get<double>();
    v[flag_us] = j.at("flag_us").get<double>();
    v[crowding] = j.value("crowding", 1.0);  // files of before it was measured: none
    v[local_alpha_us] = j.value("local_alpha_us", 0.0);
    const double local_gbs = j.value("local_link_gbs", 0.0);
    v[us_per_local_link_byte] = local_gbs > 0 ? 1e-3 / local_gbs : 0;
    return true;
  } catch (const nlohmann::json::exception& e) {
    base::log("coll", base::LogLevel::warn, "tuning file ", path, " is not one Anview wrote (",
              e.what(), "): measuring again and rewriting it");
    return false;
  }
}

void write_file(const std::string& path, int ranks, int placement, const CostModel& m) {
  const nlohmann::json j{{"version", file_version},
                         {"ranks", ranks},
                         {"placement", placement},
                         {"alpha_us", m.alpha_us},
                         {"link_gbs", m.link_bpus / 1e3},
                         {"read_gbs", m.read_bpus / 1e3},
                         {"read_us", m.read_us},
                         {"reduce_gbs", m.reduce_bpus / 1e3},
                         {"copy_gbs", m.copy_bpus / 1e3},
                         {"flag_us", m.flag_us},
                         {"crowding", m.crowding},
                         {"local_alpha_us", m.local_alpha_us},
                         {"local_link_gbs", m.local_link_bpus / 1e3}};
  const std::string partial = path + ".partial";
  std::ofstream out(partial);
  out << j.dump(2) << '\n';
  out.close();
  if (!out || std::rename(partial.c_str(), path.c_str()) != 0) {
    std::remove(partial.c_str());
    base::log("coll", base::LogLevel::warn, "cannot write the tuning file ", path, ": ",
              std::strerror(errno));
  }
}

}  // namespace

CostModel tune(Call& call, const Placement& where, std::uint64_t& shared_calls) {
  const int placement = where.bits;
  const std::string path = tuning_file_setting.value();
  if (!path.empty()) {
    // Rank 0 reads; everyone gets its verdict and values (the file may exist on one host only).
    std::array<double, fields + 1> got{};
    if (call.rank == 0) {
      Values v{};
      if (read_file(path, call.size, placement, v)) {
        got[0] = 1;
        std::copy(v.begin(), v.end(), got.begin() + 1);
      }
    }
    broadcast_binomial(call, got.data(), sizeof got, 0);
    if (got[0] == 1) {
      Values v;
      std::copy(got.begin() + 1, got.end(), v.begin());
      return to_model(v, "tuning file " + path);
    }
  }
  const Values v = measure(call, where, shared_calls);
  CostModel model = to_model(v, "measured at the first collective");
  base::log("coll", base::LogLevel::info, "collective cost model: ", describe(model));
  if (!path.empty() && call.rank == 0) write_file(path, call.size, placement, model);
  return model;
}

}  // namespace anview::collectives
