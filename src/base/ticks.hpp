// A cheap monotonic counter for per-call bookkeeping (the flight recorder reads it twice per
// collective): the CPU's time-stamp counter where it is invariant (constant rate, runs through
// sleep states: the constant_tsc and nonstop_tsc of /proc/cpuinfo), read in about 10 ns, else
// the steady clock in nanoseconds (about 25 ns in a VM with kvm-clock). Ticks from different
// processes are not comparable; convert durations with ns_per_tick().
#pragma once

#include <chrono>
#include <cstdint>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace anview::base {

// Whether ticks() reads the time-stamp counter (decided once, at static initialisation).
extern const bool ticks_are_tsc;

inline std::int64_t ticks() noexcept {
#if defined(__x86_64__)
  if (ticks_are_tsc) return static_cast<std::int64_t>(__rdtsc());
#endif
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Nanoseconds per tick: 1 for the steady clock; for the TSC measured once against the steady
// clock (over about 2 ms, the first time it is asked: ask early, off the hot path).
double ns_per_tick() noexcept;

inline double ticks_to_ns(std::int64_t ticks) noexcept {
  return static_cast<double>(ticks) * ns_per_tick();
}

}  // namespace anview::base
