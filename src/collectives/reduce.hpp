// Element-wise reduction kernels for every (DataType, ReduceOp) the collectives accept. The
// loops are simple enough for the compiler to vectorize at -O3; float16 and bfloat16 are
// widened to float, combined, and rounded back (round to nearest even).
#pragma once

#include <cstddef>
#include <string>

#include "anview/collectives.hpp"

namespace anview::collectives {

// Empty when the combination is supported, else why not (for a usage Error).
std::string unsupported(DataType type, ReduceOp op);

// acc[i] = acc[i] (op) in[i] for i < count. avg combines like sum; finish_avg divides.
void reduce_into(void* acc, const void* in, std::size_t count, DataType type, ReduceOp op);
void finish_avg(void* data, std::size_t count, DataType type, int ranks);

// Conversions used by the kernels (exposed for tests).
float half_to_float(std::uint16_t h);
std::uint16_t float_to_half(float f);
float bfloat16_to_float(std::uint16_t b);
std::uint16_t float_to_bfloat16(float f);

}  // namespace anview::collectives
