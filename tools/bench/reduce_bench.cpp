// Google Benchmark of the reduction kernels: every kernel set this CPU runs, per element type,
// in cache (256 KiB, the direct allreduce's read unit) and from memory (64 MiB), next to
// memcpy of the same size in the same run (the bar: a reduction reads twice what memcpy reads).
//   build/bin/anview-reduce-bench --benchmark_repetitions=5 --benchmark_report_aggregates_only
#include <benchmark/benchmark.h>

#include <cstring>
#include <string>
#include <vector>

#include "collectives/reduce.hpp"
#include "collectives/reduce_kernels.hpp"

namespace {

using anview::DataType;
using anview::ReduceOp;

// Normal values of every type (no subnormal halves), so the kernels run their common path.
std::vector<char> filled(std::size_t bytes, DataType type) {
  std::vector<char> buf(bytes);
  const std::size_t esize = anview::size_of(type);
  for (std::size_t i = 0; i + esize <= bytes; i += esize) {
    switch (type) {
      case DataType::float32: {
        const float f = static_cast<float>(i % 13) + 1.0f;
        std::memcpy(&buf[i], &f, 4);
        break;
      }
      case DataType::float16: {
        const std::uint16_t h = anview::collectives::float_to_half(static_cast<float>(i % 13) + 1);
        std::memcpy(&buf[i], &h, 2);
        break;
      }
      case DataType::bfloat16: {
        const std::uint16_t h =
            anview::collectives::float_to_bfloat16(static_cast<float>(i % 13) + 1);
        std::memcpy(&buf[i], &h, 2);
        break;
      }
      default:
        buf[i] = static_cast<char>(i % 13 + 1);
    }
  }
  return buf;
}

void reduce(benchmark::State& state, const anview::collectives::ReduceKernels* kernels,
            DataType type) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const auto a = filled(bytes, type);
  const auto b = filled(bytes, type);
  std::vector<char> out(bytes);
  const std::size_t count = bytes / anview::size_of(type);
  for (auto _ : state) {
    kernels->reduce_to(out.data(), a.data(), b.data(), count, type, ReduceOp::sum);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

void copy(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::vector<char> a(bytes, 1);
  std::vector<char> out(bytes);
  for (auto _ : state) {
    std::memcpy(out.data(), a.data(), bytes);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

constexpr std::int64_t in_cache = 256 << 10;
constexpr std::int64_t from_memory = 64 << 20;

int register_all() {
  benchmark::RegisterBenchmark("memcpy", copy)->Arg(in_cache)->Arg(from_memory);
  for (const char* isa : {"generic", "avx2", "avx512"}) {
    const auto* kernels = anview::collectives::reduce_kernels(isa);
    if (kernels == nullptr) continue;  // not on this CPU
    for (DataType type : {DataType::float32, DataType::float16, DataType::bfloat16,
                          DataType::float64, DataType::int32, DataType::int8}) {
      const std::string name = "sum/" + std::string(anview::name_of(type)) + "/" + std::string(isa);
      benchmark::RegisterBenchmark(name.c_str(), reduce, kernels, type)
          ->Arg(in_cache)
          ->Arg(from_memory);
    }
  }
  return 0;
}

const int registered = register_all();

}  // namespace

BENCHMARK_MAIN();
