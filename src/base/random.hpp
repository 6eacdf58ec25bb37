// Random 64-bit values for identifiers and salts that must differ between processes and runs
// (a job id, a ring's flag salt, a region token seed); not for secrets (see auth.hpp).
#pragma once

#include <cstdint>
#include <random>

namespace anview::base {

inline std::uint64_t random_u64() {
  std::random_device device;
  return std::uint64_t{device()} << 32 | device();
}

}  // namespace anview::base
