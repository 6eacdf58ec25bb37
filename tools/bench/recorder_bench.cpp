// What the flight recorder and the metrics cost per collective call: the bookkeeping of one
// call (begin, algorithm, end, as Collectives does it) in a loop. Build it twice, once with
// -DANVIEW_METRICS=OFF, and compare BM_RecordedCall; a call reads base::ticks() twice
// (BM_Ticks; BM_ClockRead is the steady clock it replaces where the TSC is invariant).
#include <benchmark/benchmark.h>

#include "base/clock.hpp"
#include "base/metrics.hpp"
#include "base/ticks.hpp"
#include "collectives/flight_recorder.hpp"

namespace {

using anview::collectives::FlightRecorder;
using anview::collectives::Recording;

void BM_RecordedCall(benchmark::State& state) {
  FlightRecorder recorder(1024);
  std::uint64_t seq = 0;
  for (auto _ : state) {
    ++seq;
    recorder.begin(seq, "allreduce", 8, -1);
    Recording record(&recorder, seq);
    record.algorithm("shared");
  }
  state.SetLabel(anview::base::metrics::enabled ? "metrics on" : "metrics compiled out");
}
BENCHMARK(BM_RecordedCall);

void BM_ClockRead(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(anview::base::Clock::now());
}
BENCHMARK(BM_ClockRead);

void BM_Ticks(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(anview::base::ticks());
  state.SetLabel(anview::base::ticks_are_tsc ? "tsc" : "steady clock");
}
BENCHMARK(BM_Ticks);

}  // namespace

BENCHMARK_MAIN();
