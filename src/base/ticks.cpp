#include "base/ticks.hpp"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <thread>

namespace anview::base {
namespace {

bool invariant_tsc() {
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0x80000000, &eax, &ebx, &ecx, &edx) == 0 || eax < 0x80000007) return false;
  if (__get_cpuid(0x80000007, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (edx & (1u << 8)) != 0;  // CPUID.80000007H:EDX[8], invariant TSC
#else
  return false;
#endif
}

double calibrate() {
  if (!ticks_are_tsc) return 1.0;
  using std::chrono::steady_clock;
  // Two readings 2 ms apart, each pair taken back to back; the error is the clocks' reading
  // time over 2 ms, a few parts in 100,000.
  const auto t0 = steady_clock::now();
  const std::int64_t c0 = ticks();
  auto t1 = t0;
  while (t1 - t0 < std::chrono::milliseconds(2)) t1 = steady_clock::now();
  const std::int64_t c1 = ticks();
  const double ns = std::chrono::duration<double, std::nano>(t1 - t0).count();
  return c1 > c0 ? ns / static_cast<double>(c1 - c0) : 1.0;
}

}  // namespace

const bool ticks_are_tsc = invariant_tsc();

double ns_per_tick() noexcept {
  static const double ratio = calibrate();
  return ratio;
}

}  // namespace anview::base
