// The CPUs this process may run on (its affinity mask), which the collectives compare with the
// ranks sharing a host.
#pragma once

#include <sched.h>

namespace anview::base {

// 0 where the mask cannot be read.
inline int usable_cpus() {
  cpu_set_t cpus;
  return ::sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 0;
}

}  // namespace anview::base
