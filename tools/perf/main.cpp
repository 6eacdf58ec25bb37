// anview-perf: point-to-point benchmarks between rank 0 and rank 1 (other ranks idle), and
// collective benchmarks over all ranks (collective.cpp).
//
//   pingpong  one-way latency = round trip / 2, per iteration; p50 / p99 / avg over iterations
//   bw        streaming bandwidth with a window of outstanding sends (like ucx_perftest tag_bw):
//             rank 0 posts `window` isends, rank 1 the matching irecvs, then a 0-byte ack
//   put, get  one-sided bandwidth into / out of rank 1's registered memory (ucp_put_bw,
//             ucp_get_bw): a window of puts then a flush, or of gets (one_sided.cpp)
//
//   allreduce, broadcast, reduce, allgather, reduce_scatter, alltoall, barrier: nccl-tests
//             columns (size, count, type, redop, root, algo, time_us, algbw, busbw, #wrong)
//
// On a terminal, rank 0 shows a progress bar on stderr (progress.cpp); --plot FILE.png draws
// bandwidth and latency against the size with gnuplot (plot.cpp).
//
// Run under a launcher: anview-run -n 2 anview-perf pingpong -b 8 -e 16M --json
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "anview/anview.hpp"
#include "base/config.hpp"
#include "base/ticks.hpp"
#include "buffer.hpp"
#include "collective.hpp"
#include "one_sided.hpp"
#include "plot.hpp"
#include "progress.hpp"
#include "pubsub.hpp"
#include "rpc.hpp"
#include "sweep.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string op;
  std::string min_size = "8";
  std::string max_size = "16M";
  double factor = 4;
  long iters = 0;    // 0: automatic from the size
  long warmup = -1;  // -1: automatic
  int window = 0;    // 0: automatic
  bool check = false;
  bool in_place = false;
  bool user_memory = false;  // put, get: rank 1 registers its own memory (not allocate_memory)
  bool huge_pages = false;   // payloads (all but rpc, pubsub) in anview::HostBuffers
  std::string algo;
  bool json = false;
  std::string dtype = "float32";
  std::string redop = "sum";
  int root = 0;
  std::string plot;  // --plot: the PNG to draw
  // rpc
  std::vector<std::string> sizes{"64", "16K", "1M"};
  std::vector<int> concurrency{1, 16};
  int threads = 1;
  double seconds = 3.0;
  int handler_threads = 0;
  std::string listen = "127.0.0.1:0";
  std::string policy = "block";
};

struct Result {
  std::size_t bytes = 0;
  long iters = 0;
  double p50 = 0, p99 = 0, avg = 0;  // microseconds
  double gbs = 0;
  long wrong = 0;
};

constexpr anview::Tag data_tag{1};
constexpr anview::Tag sync_tag{2};

long auto_iters(std::size_t bytes, const Options& o) {
  if (o.iters > 0) return o.iters;
  const double budget = 2e9;  // bytes moved per size
  return std::clamp<long>(
      static_cast<long>(budget / static_cast<double>(std::max<std::size_t>(bytes, 1024))), 20,
      20000);
}

// The payload pattern of iteration `i`; the receiver checks it with --check.
void fill(perf::Buffer<unsigned char>& buf, std::size_t bytes, long i) {
  for (std::size_t k = 0; k < bytes; ++k)
    buf[k] = static_cast<unsigned char>((k * 131 + static_cast<std::size_t>(i) * 7 + 1) & 0xff);
}

bool verify(const perf::Buffer<unsigned char>& buf, std::size_t bytes, long i) {
  for (std::size_t k = 0; k < bytes; ++k)
    if (buf[k] !=
        static_cast<unsigned char>((k * 131 + static_cast<std::size_t>(i) * 7 + 1) & 0xff))
      return false;
  return true;
}

void sync(anview::Communicator& comm) {
  char dummy = 0;
  if (comm.rank() == 0) {
    comm.send(&dummy, 0, 1, sync_tag);
    comm.recv(&dummy, 0, 1, sync_tag);
  } else {
    comm.recv(&dummy, 0, 0, sync_tag);
    comm.send(&dummy, 0, 0, sync_tag);
  }
}

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  const auto k = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
  return v[k];
}

Result pingpong(anview::Communicator& comm, std::size_t bytes, const Options& o) {
  const long iters = auto_iters(bytes, o);
  const long warmup = o.warmup >= 0 ? o.warmup : std::min<long>(iters / 10 + 2, 1000);
  perf::Buffer<unsigned char> sbuf(std::max<std::size_t>(bytes, 1), o.huge_pages),
      rbuf(sbuf.size(), o.huge_pages);
  const int peer = 1 - comm.rank();
  std::vector<double> samples;
  samples.reserve(static_cast<std::size_t>(iters));
  Result r{.bytes = bytes, .iters = iters};
  // Each iteration is timed with the time-stamp counter (about 10 ns to read here, where the
  // kvm-clock steady clock takes 28 ns), as ucx_perftest times its: a clock read in the timed
  // interval is part of the figure.
  const double us_per_tick = anview::base::ns_per_tick() * 1e-3;
  sync(comm);
  for (long i = -warmup; i < iters; ++i) {
    if (o.check) fill(sbuf, bytes, i);
    const std::int64_t t0 = anview::base::ticks();
    if (comm.rank() == 0) {
      comm.send(sbuf.data(), bytes, peer, data_tag);
      comm.recv(rbuf.data(), rbuf.size(), peer, data_tag);
    } else {
      comm.recv(rbuf.data(), rbuf.size(), peer, data_tag);
      if (o.check && !verify(rbuf, bytes, i)) ++r.wrong;
      comm.send(o.check ? rbuf.data() : sbuf.data(), bytes, peer, data_tag);
    }
    const std::int64_t t1 = anview::base::ticks();
    if (comm.rank() == 0 && o.check && !verify(rbuf, bytes, i)) ++r.wrong;
    if (i >= 0) samples.push_back(static_cast<double>(t1 - t0) * us_per_tick / 2);
  }
  double sum = 0;
  for (double s : samples) sum += s;
  r.avg = sum / static_cast<double>(samples.size());
  r.p50 = percentile(samples, 0.5);
  r.p99 = percentile(samples, 0.99);
  r.gbs = static_cast<double>(bytes) / (r.avg * 1e3);
  return r;
}

Result bandwidth(anview::Communicator& comm, std::size_t bytes, const Options& o) {
  const int window = o.window > 0 ? o.window
                                  : static_cast<int>(std::clamp<std::size_t>(
                                        (256u << 20) / std::max<std::size_t>(bytes, 1), 2, 64));
  long iters = auto_iters(bytes, o);
  iters = std::max<long>(window, iters / window * window);
  const long warmup = o.warmup >= 0 ? o.warmup : window;
  // Like ucx_perftest tag_bw and osu_bw, every slot of the window uses the same buffer, so
  // the figure is the transport's, not the memory system's; --check needs one per slot.
  std::vector<perf::Buffer<unsigned char>> bufs;
  for (int w = 0; w < (o.check ? window : 1); ++w)
    bufs.emplace_back(std::max<std::size_t>(bytes, 1), o.huge_pages);
  auto slot = [&](int w) -> perf::Buffer<unsigned char>& {
    return bufs[o.check ? static_cast<std::size_t>(w) : 0];
  };
  const int peer = 1 - comm.rank();
  Result r{.bytes = bytes, .iters = iters};
  std::vector<double> per_window;
  sync(comm);
  auto run_window = [&](long first) {
    std::vector<anview::Request> reqs;
    reqs.reserve(static_cast<std::size_t>(window));
    for (int w = 0; w < window; ++w) {
      auto& buf = slot(w);
      if (comm.rank() == 0) {
        if (o.check) fill(buf, bytes, first + w);
        reqs.push_back(comm.isend(buf.data(), bytes, peer, data_tag));
      } else {
        reqs.push_back(comm.irecv(buf.data(), buf.size(), peer, data_tag));
      }
    }
    for (auto& q : reqs) q.wait();
    if (comm.rank() == 1 && o.check)
      for (int w = 0; w < window; ++w)
        if (!verify(slot(w), bytes, first + w)) ++r.wrong;
    char ack = 0;
    if (comm.rank() == 1)
      comm.send(&ack, 0, peer, sync_tag);
    else
      comm.recv(&ack, 0, peer, sync_tag);
  };
  for (long i = 0; i < warmup; i += window) run_window(i);
  const auto t0 = Clock::now();
  for (long i = 0; i < iters; i += window) {
    const auto w0 = Clock::now();
    run_window(i);
    per_window.push_back(std::chrono::duration<double, std::micro>(Clock::now() - w0).count() /
                         window);
  }
  const double total_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  r.avg = total_us / static_cast<double>(iters);
  r.p50 = percentile(per_window, 0.5);
  r.p99 = percentile(per_window, 0.99);
  r.gbs = static_cast<double>(bytes) * static_cast<double>(iters) / (total_us * 1e3);
  return r;
}

Result one_sided(anview::Communicator& comm, std::size_t bytes, const Options& o,
                 const anview::RemoteKey& target, unsigned char* region) {
  const int window = o.window > 0 ? o.window : perf::one_sided_window(bytes);
  long iters = auto_iters(bytes, o);
  iters = std::max<long>(window, iters / window * window);
  const long warmup = o.warmup >= 0 ? o.warmup : window;
  auto m = perf::measure_one_sided(comm,
                                   {.put = o.op == "put",
                                    .bytes = bytes,
                                    .window = window,
                                    .iters = iters,
                                    .warmup = warmup,
                                    .check = o.check,
                                    .huge_pages = o.huge_pages},
                                   target, region);
  Result r{.bytes = bytes, .iters = iters, .wrong = m.wrong};
  if (comm.rank() != 0) return r;
  r.avg = m.total_us / static_cast<double>(iters);
  r.p50 = percentile(m.per_window_us, 0.5);
  r.p99 = percentile(m.per_window_us, 0.99);
  r.gbs = static_cast<double>(bytes) * static_cast<double>(iters) / (m.total_us * 1e3);
  return r;
}

// pingpong, bw, put or get between ranks 0 and 1 (other ranks idle); rank 0 prints, shows
// `progress` and appends each result line to `points`. Returns the number of wrong payloads.
long run_point_to_point(anview::Communicator& comm, const Options& o, std::size_t min_bytes,
                        std::size_t max_bytes, perf::Progress& progress,
                        std::vector<perf::PlotPoint>& points) {
  if (comm.rank() > 1) return 0;
  const std::string transport = comm.transport_name(1 - comm.rank());
  if (comm.rank() == 0 && !o.json) {
    std::printf("# anview-perf %s, ranks 0<->1 over %s (%s)\n", o.op.c_str(), transport.c_str(),
                comm.describe_peer(1).c_str());
    std::printf("%12s %10s %12s %12s %12s %10s %8s\n", "bytes", "iters", "lat_us_p50", "lat_us_p99",
                "lat_us_avg", "GB/s", "wrong");
  }
  long total_wrong = 0;
  const auto sizes = perf::sweep_sizes(min_bytes, max_bytes, o.factor);
  // put / get: rank 1's region, for the largest size; its key goes to rank 0.
  const bool rma = o.op == "put" || o.op == "get";
  // Allocated by Anview (shared memory peers on this host map), as ucx_perftest allocates
  // its; --user-memory registers a buffer of rank 1's own instead (heap, or a HostBuffer with
  // --huge-pages).
  perf::Buffer<unsigned char> user(
      rma && o.user_memory && comm.rank() == 1 ? std::max<std::size_t>(max_bytes, 1) : 0,
      o.huge_pages);
  anview::MemoryRegion registered;
  anview::RemoteKey target;
  if (rma) {
    std::array<std::byte, anview::RemoteKey::packed_bytes> packed{};
    if (comm.rank() == 1) {
      registered = o.user_memory ? comm.register_memory(user.data(), user.size())
                                 : comm.allocate_memory(std::max<std::size_t>(max_bytes, 1));
      packed = registered.key().pack();
      comm.send(packed.data(), packed.size(), 0, sync_tag);
    } else {
      comm.recv(packed.data(), packed.size(), 1, sync_tag);
      target = anview::RemoteKey::unpack(packed);
    }
  }
  progress.start(o.op, sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::size_t bytes = sizes[i];
    progress.measuring(i, bytes);
    Result r = o.op == "pingpong" ? pingpong(comm, bytes, o)
               : o.op == "bw"     ? bandwidth(comm, bytes, o)
                                  : one_sided(comm, bytes, o, target,
                                              static_cast<unsigned char*>(registered.data()));
    // The receiver counts bad payloads; rank 0 reports them.
    long wrong = r.wrong;
    if (comm.rank() == 1)
      comm.send(&wrong, sizeof wrong, 0, sync_tag);
    else {
      long remote = 0;
      comm.recv(&remote, sizeof remote, 1, sync_tag);
      wrong += remote;
    }
    total_wrong += wrong;
    if (comm.rank() == 0) {
      progress.clear();
      points.push_back({.op = o.op, .bytes = bytes, .bandwidth_gbs = r.gbs, .latency_us = r.p50});
      if (o.json) {
        nlohmann::json j{{"op", o.op},
                         {"bytes", bytes},
                         {"transport", transport},
                         {"iters", r.iters},
                         {"lat_us_p50", r.p50},
                         {"lat_us_p99", r.p99},
                         {"lat_us_avg", r.avg},
                         {"bw_gbs", r.gbs},
                         {"wrong", wrong},
                         {"check", o.check},
                         {"huge_pages", o.huge_pages}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("%12s %10ld %12.2f %12.2f %12.2f %10.3f %8ld\n",
                    perf::human_size(bytes).c_str(), r.iters, r.p50, r.p99, r.avg, r.gbs, wrong);
      }
      std::fflush(stdout);
    }
  }
  progress.clear();
  return total_wrong;
}

// Rank 0 checks the --plot path before the sweep and tells the others; false: it is unusable
// (rank 0 has said why).
bool plot_path_usable(anview::Communicator& comm, const std::string& path) {
  if (path.empty()) return true;
  std::int32_t usable = 1;
  if (comm.rank() == 0) {
    try {
      perf::check_plot_path(path);
    } catch (const std::exception& e) {
      std::cerr << "anview-perf: " << e.what() << "\n";
      usable = 0;
    }
  }
  comm.broadcast(&usable, 1, anview::DataType::int32, 0);
  return usable != 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"anview-perf: point-to-point latency and bandwidth between rank 0 and rank 1"};
  app.add_option("op", o.op,
                 "pingpong, bw, put, get, rpc, pubsub, a collective (allreduce, broadcast, reduce, "
                 "allgather, reduce_scatter, alltoall, barrier), or all (every collective in turn)")
      ->required()
      ->check(
          CLI::IsMember({"pingpong", "bw", "put", "get", "rpc", "pubsub", "allreduce", "broadcast",
                         "reduce", "allgather", "reduce_scatter", "alltoall", "barrier", "all"}));
  app.add_option("-a,--algo", o.algo,
                 "collectives: force this algorithm for the collective (sets ANVIEW_ALGO)");
  app.add_option("-d,--dtype", o.dtype, "collectives: element type (float32, int32, ...)");
  app.add_option("-o,--redop", o.redop, "collectives: sum, prod, min, max, avg, band, bor, bxor");
  app.add_option("-r,--root", o.root, "broadcast and reduce: the root rank");
  app.add_option("-b,--min-bytes", o.min_size, "smallest message (K/M/G suffixes)");
  app.add_option("-e,--max-bytes", o.max_size, "largest message (K/M/G suffixes)");
  app.add_option("-f,--factor", o.factor, "size step factor")->check(CLI::PositiveNumber);
  app.add_option("-n,--iters", o.iters, "iterations per size (default: automatic)");
  app.add_option("-w,--warmup", o.warmup, "warm-up iterations per size (default: automatic)");
  app.add_option("--window", o.window, "bw, put, get: operations in flight (default: automatic)");
  app.add_flag("--check", o.check, "fill and verify every payload");
  app.add_flag("--user-memory", o.user_memory,
               "put, get: the target registers a buffer of its own (register_memory) instead of "
               "allocate_memory's shared memory");
  app.add_flag("--huge-pages", o.huge_pages,
               "pingpong, bw, collectives: payload buffers from anview::HostBuffer (2 MiB pages "
               "where the kernel allows) instead of the heap; put, get: the initiator's buffer, "
               "and the target's with --user-memory");
  app.add_flag("--json", o.json, "rank 0 prints one JSON object per size");
  app.add_flag("--inplace", o.in_place, "allreduce, allgather: receive into the send buffer");
  app.add_option("--plot", o.plot,
                 "rank 0 draws bandwidth and latency against the size into this PNG (gnuplot)")
      ->type_name("FILE.png");
  app.add_option("--sizes", o.sizes, "rpc, pubsub: payload sizes (default 64,16K,1M)")
      ->delimiter(',');
  app.add_option("--policy", o.policy, "pubsub: block or drop_oldest")
      ->check(CLI::IsMember({"block", "drop_oldest"}));
  app.add_option("--concurrency", o.concurrency, "rpc: calls in flight per case (default 1,16)")
      ->delimiter(',');
  app.add_option("--threads", o.threads, "rpc: client threads sharing the calls in flight");
  app.add_option("--seconds", o.seconds,
                 "rpc, pubsub: measured seconds per case (after 0.5 s warm-up)");
  app.add_option("--handler-threads", o.handler_threads,
                 "rpc: the server's handler threads (0: on the connection's thread)");
  app.add_option("--listen", o.listen, "rpc: the server's address (rank 0)");
  CLI11_PARSE(app, argc, argv);

  try {
    if (!o.algo.empty()) {
      if (!perf::is_collective(o.op) || o.op == "all")
        throw std::runtime_error("-a applies to one collective, not " + o.op);
      ::setenv("ANVIEW_ALGO", (o.op + "=" + o.algo).c_str(), 1);  // read by the communicator
    }
    const auto min_bytes = static_cast<std::size_t>(anview::base::parse_size(o.min_size, "-b"));
    const auto max_bytes = static_cast<std::size_t>(anview::base::parse_size(o.max_size, "-e"));
    if (o.factor <= 1.0) throw std::runtime_error("-f must be > 1");
    if (o.huge_pages && (o.op == "rpc" || o.op == "pubsub"))
      throw std::runtime_error("--huge-pages applies to pingpong, bw, put, get and collectives");
    auto comm = anview::Communicator::from_env();
    if (!plot_path_usable(comm, o.plot)) return 2;
    perf::Progress progress(comm.rank() == 0 && !o.json);
    std::vector<perf::PlotPoint> points;
    perf::PlotLabels labels{
        .title = "anview-perf " + o.op + ", " + std::to_string(comm.size()) + " ranks",
        .bandwidth = "busbw (GB/s)",
        .latency = "latency (µs, time_us)"};
    long wrong = 0;
    if (o.op == "pubsub") {
      if (comm.size() < 2) {
        std::cerr << "anview-perf: pubsub needs 2 ranks (anview-run -n 2 anview-perf pubsub)\n";
        return 2;
      }
      perf::PubSubOptions p{.seconds = o.seconds,
                            .policy = o.policy == "block" ? anview::Backpressure::block
                                                          : anview::Backpressure::drop_oldest,
                            .listen = o.listen,
                            .check = o.check,
                            .json = o.json};
      for (const auto& size : o.sizes)
        p.sizes.push_back(static_cast<std::size_t>(anview::base::parse_size(size, "--sizes")));
      return perf::run_pubsub(comm, p) == 0 ? 0 : 1;
    }
    if (o.op == "rpc") {
      if (comm.size() < 2) {
        std::cerr << "anview-perf: rpc needs 2 ranks (anview-run -n 2 anview-perf rpc)\n";
        return 2;
      }
      perf::RpcOptions r{.threads = o.threads,
                         .seconds = o.seconds,
                         .handler_threads = o.handler_threads,
                         .listen = o.listen,
                         .check = o.check,
                         .json = o.json};
      for (const auto& size : o.sizes)
        r.sizes.push_back(static_cast<std::size_t>(anview::base::parse_size(size, "--sizes")));
      r.concurrency = o.concurrency;
      return perf::run_rpc(comm, r) == 0 ? 0 : 1;
    }
    if (perf::is_collective(o.op) || o.op == "all") {
      perf::CollectiveOptions c{.op = o.op,
                                .min_bytes = min_bytes,
                                .max_bytes = max_bytes,
                                .factor = o.factor,
                                .iters = o.iters,
                                .warmup = o.warmup,
                                .root = o.root,
                                .check = o.check,
                                .in_place = o.in_place,
                                .huge_pages = o.huge_pages,
                                .json = o.json};
      const auto type = anview::data_type_named(o.dtype);
      const auto redop = anview::reduce_op_named(o.redop);
      if (!type) throw std::runtime_error("unknown -d " + o.dtype);
      if (!redop) throw std::runtime_error("unknown -o " + o.redop);
      c.type = *type;
      c.redop = *redop;
      if (o.in_place && o.op != "allreduce" && o.op != "allgather")
        throw std::runtime_error("--inplace applies to allreduce and allgather only");
      if (o.op != "all") {
        wrong = perf::run_collective(comm, c, progress, points);
      } else {
        const auto& ops = perf::collective_names();
        for (std::size_t i = 0; i < ops.size(); ++i) {
          c.op = ops[i];
          progress.set_op_index(i + 1, ops.size());
          wrong += perf::run_collective(comm, c, progress, points);
          if (comm.rank() == 0 && !o.json) std::printf("\n");
        }
      }
    } else {
      if (comm.size() < 2) {
        std::cerr << "anview-perf: needs at least 2 ranks (e.g. anview-run -n 2 anview-perf "
                  << o.op << ")\n";
        return 2;
      }
      wrong = run_point_to_point(comm, o, min_bytes, max_bytes, progress, points);
      labels = {.title = "anview-perf " + o.op + ", ranks 0<->1",
                .bandwidth = "bandwidth (GB/s)",
                .latency = "latency (µs, p50)"};
    }
    // After the results are out: a missing or failing gnuplot still fails the run.
    if (!o.plot.empty() && comm.rank() == 0) perf::plot(points, labels, o.plot);
    return wrong == 0 ? 0 : 1;
  } catch (const anview::Error& e) {
    std::cerr << "anview-perf: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "anview-perf: " << e.what() << "\n";
    return 2;
  }
}
