#include "collective.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include <nlohmann/json.hpp>

#include "buffer.hpp"
#include "check.hpp"
#include "sweep.hpp"

namespace perf {
namespace {

using Clock = std::chrono::steady_clock;
using anview::DataType;
using anview::ReduceOp;

const char* const collectives[] = {"allreduce",      "broadcast", "reduce", "allgather",
                                   "reduce_scatter", "alltoall",  "barrier"};

// Bus bandwidth factor (nccl-tests' definitions).
double bus_factor(const std::string& op, int n) {
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "allgather" || op == "reduce_scatter" || op == "alltoall")
    return static_cast<double>(n - 1) / n;
  return 1.0;
}

struct Sample {
  std::size_t count = 0;
  double time_us = 0;
  long wrong = 0;
};

Sample measure(anview::Communicator& comm, const CollectiveOptions& o, std::size_t bytes) {
  const int n = comm.size();
  const int me = comm.rank();
  const std::size_t esize = anview::size_of(o.type);
  const bool per_rank = o.op == "allgather" || o.op == "reduce_scatter" || o.op == "alltoall";
  // nccl-tests: the size is the largest buffer; per-rank blocks for the gathering kinds.
  const std::size_t count = per_rank ? bytes / esize / static_cast<std::size_t>(n) : bytes / esize;
  const std::size_t total = per_rank ? count * static_cast<std::size_t>(n) : count;
  Buffer<char> send(std::max<std::size_t>(total * esize, 1), o.huge_pages),
      recv(send.size(), o.huge_pages);
  const CheckCase check{.op = o.op,
                        .type = o.type,
                        .redop = o.redop,
                        .root = o.root,
                        .ranks = n,
                        .rank = me,
                        .count = count};
  auto fill = [&] { fill_send(check, send.data()); };
  // In place: allreduce works in recv, allgather finds this rank's block at its place in recv.
  auto start_in_place = [&] {
    if (o.op == "allreduce") std::memcpy(recv.data(), send.data(), count * esize);
    if (o.op == "allgather")
      std::memcpy(recv.data() + static_cast<std::size_t>(me) * count * esize, send.data(),
                  count * esize);
  };
  fill();
  if (o.in_place) start_in_place();
  // The call, chosen once: the timed loop runs nothing but the collective (as the peers'
  // benchmarks do), not a string comparison per kind before it.
  enum class Kind {
    allreduce,
    allreduce_in_place,
    allgather,
    allgather_in_place,
    broadcast,
    reduce,
    reduce_scatter,
    alltoall,
    barrier
  };
  const Kind kind = o.op == "allreduce" ? (o.in_place ? Kind::allreduce_in_place : Kind::allreduce)
                    : o.op == "allgather"
                        ? (o.in_place ? Kind::allgather_in_place : Kind::allgather)
                    : o.op == "broadcast"      ? Kind::broadcast
                    : o.op == "reduce"         ? Kind::reduce
                    : o.op == "reduce_scatter" ? Kind::reduce_scatter
                    : o.op == "alltoall"       ? Kind::alltoall
                                               : Kind::barrier;
  char* const own_block = recv.data() + static_cast<std::size_t>(me) * count * esize;
  auto once = [&] {
    switch (kind) {
      case Kind::allreduce_in_place:
        return comm.allreduce(recv.data(), count, o.type, o.redop);
      case Kind::allgather_in_place:
        return comm.allgather(own_block, recv.data(), count, o.type);
      case Kind::allreduce:
        return comm.allreduce(send.data(), recv.data(), count, o.type, o.redop);
      case Kind::broadcast:
        return comm.broadcast(send.data(), count, o.type, o.root);
      case Kind::reduce:
        return comm.reduce(send.data(), recv.data(), count, o.type, o.redop, o.root);
      case Kind::allgather:
        return comm.allgather(send.data(), recv.data(), count, o.type);
      case Kind::reduce_scatter:
        return comm.reduce_scatter(send.data(), recv.data(), count, o.type, o.redop);
      case Kind::alltoall:
        return comm.alltoall(send.data(), recv.data(), count, o.type);
      case Kind::barrier:
        return comm.barrier();
    }
  };
  const long iters =
      o.iters > 0
          ? o.iters
          : std::clamp<long>(static_cast<long>(1e9 / std::max<double>(bytes, 1024)), 5, 2000);
  const long warmup = o.warmup >= 0 ? o.warmup : iters / 10 + 2;
  Sample s{count, 0, 0};
  for (long i = 0; i < warmup; ++i) once();
  comm.barrier();
  const auto t0 = Clock::now();
  for (long i = 0; i < iters; ++i) once();
  double mine = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
  // The slowest rank's time, as nccl-tests and ../shared/peers report it.
  comm.allreduce(&mine, 1, DataType::float64, ReduceOp::max);
  s.time_us = mine;
  if (o.check) {
    fill();
    // All bits set: no result has that value (a NaN in floating-point types, -1 or the
    // largest value in integer ones), so an element the call did not write is wrong.
    std::fill(recv.begin(), recv.end(), static_cast<char>(0xFF));
    if (o.in_place) start_in_place();
    once();
    s.wrong = count_wrong(check, send.data(), recv.data());
  }
  long wrong = s.wrong;
  comm.allreduce(&wrong, 1, DataType::int64, ReduceOp::sum);
  s.wrong = wrong;
  return s;
}

}  // namespace

const std::vector<const char*>& collective_names() {
  static const std::vector<const char*> names(std::begin(collectives), std::end(collectives));
  return names;
}

bool is_collective(const std::string& op) {
  return std::find(std::begin(collectives), std::end(collectives), op) != std::end(collectives);
}

long run_collective(anview::Communicator& comm, const CollectiveOptions& o, Progress& progress,
                    std::vector<PlotPoint>& points) {
  const int n = comm.size();
  const std::string transport = n > 1 ? comm.transport_name(comm.rank() == 0 ? 1 : 0) : "self";
  if (comm.rank() == 0 && !o.json) {
    std::printf("# anview-perf %s%s, %d ranks, %s, rank 0 <-> 1 over %s\n", o.op.c_str(),
                o.in_place ? " (in place)" : "", n, std::string(anview::name_of(o.type)).c_str(),
                transport.c_str());
    std::printf("%12s %12s %8s %6s %5s %20s %12s %10s %10s %7s\n", "size", "count", "type", "redop",
                "root", "algo", "time_us", "algbw", "busbw", "#wrong");
  }
  long total_wrong = 0;
  const std::size_t esize = anview::size_of(o.type);
  const auto sizes = sweep_sizes(std::max(o.min_bytes, esize), o.max_bytes, o.factor);
  progress.start(o.op, sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::size_t bytes = sizes[i];
    progress.measuring(i, bytes);
    const Sample s = measure(comm, o, bytes);
    total_wrong += s.wrong;
    const double algbw = static_cast<double>(bytes) / (s.time_us * 1e3);
    const double busbw = algbw * bus_factor(o.op, n);
    const std::string algo = comm.collective_algorithm(o.op, bytes);
    if (comm.rank() == 0) {
      progress.clear();
      // A barrier moves no data: it has a time but no bandwidth to draw.
      const double drawn_busbw =
          o.op == "barrier" ? std::numeric_limits<double>::quiet_NaN() : busbw;
      points.push_back(
          {.op = o.op, .bytes = bytes, .bandwidth_gbs = drawn_busbw, .latency_us = s.time_us});
      const std::string redop(anview::name_of(o.redop));
      if (o.json) {
        nlohmann::json j{{"op", o.op},
                         {"bytes", bytes},
                         {"count", s.count},
                         {"dtype", std::string(anview::name_of(o.type))},
                         {"redop", redop},
                         {"root", o.root},
                         {"algo", algo},
                         {"transport", transport},
                         {"ranks", n},
                         {"time_us", s.time_us},
                         {"in_place", o.in_place},
                         {"algbw_gbs", algbw},
                         {"busbw_gbs", busbw},
                         {"wrong", s.wrong},
                         {"check", o.check},
                         {"huge_pages", o.huge_pages}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("%12zu %12zu %8s %6s %5d %20s %12.2f %10.3f %10.3f %7ld\n", bytes, s.count,
                    std::string(anview::name_of(o.type)).c_str(), redop.c_str(), o.root,
                    algo.c_str(), s.time_us, algbw, busbw, s.wrong);
      }
      std::fflush(stdout);
    }
  }
  progress.clear();
  return total_wrong;
}

}  // namespace perf
