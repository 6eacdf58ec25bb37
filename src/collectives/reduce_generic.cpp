// The kernels for any CPU the build targets (and the scalar 16-bit float conversions).
#define ANVIEW_KERNELS_NAME "generic"
#define ANVIEW_KERNELS_GETTER generic_kernels
#include "collectives/reduce_kernels.inc"

#include "collectives/reduce.hpp"

namespace anview::collectives {

float half_to_float(std::uint16_t h) {
  return scalar_half_to_float(h);
}
std::uint16_t float_to_half(float f) {
  return scalar_float_to_half(f);
}
float bfloat16_to_float(std::uint16_t b) {
  return scalar_bfloat16_to_float(b);
}
std::uint16_t float_to_bfloat16(float f) {
  return scalar_float_to_bfloat16(f);
}

}  // namespace anview::collectives
