// Element-wise reductions for every (DataType, ReduceOp) the collectives accept, run by the
// widest kernel set this CPU supports (reduce_kernels.hpp; ANVIEW_CPU_KERNELS overrides).
// float16 and bfloat16 are widened to float, combined, and rounded back (to nearest even).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "anview/collectives.hpp"

namespace anview::collectives {

// Empty when the combination is supported, else why not (for a usage Error).
std::string unsupported(DataType type, ReduceOp op);

// acc[i] = acc[i] (op) in[i] for i < count. avg combines like sum; finish_avg divides.
void reduce_into(void* acc, const void* in, std::size_t count, DataType type, ReduceOp op);
// out[i] = a[i] (op) b[i]; out may be a or b, and must not otherwise overlap them.
void reduce_to(void* out, const void* a, const void* b, std::size_t count, DataType type,
               ReduceOp op);
void finish_avg(void* data, std::size_t count, DataType type, int ranks);

// The kernel set in use ("avx512", "avx2", "generic"), for anview-info and anview-perf.
std::string_view reduce_kernels_name();
struct ReduceKernels;
// A kernel set by name if this build has it and this CPU runs it, else null (for tests).
const ReduceKernels* reduce_kernels(std::string_view name);

// Conversions used by the kernels (exposed for tests).
float half_to_float(std::uint16_t h);
std::uint16_t float_to_half(float f);
float bfloat16_to_float(std::uint16_t b);
std::uint16_t float_to_bfloat16(float f);

}  // namespace anview::collectives
