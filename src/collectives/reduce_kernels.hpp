// The reduction kernels, compiled once per instruction set (reduce_generic.cpp, reduce_avx2.cpp,
// reduce_avx512.cpp) and chosen at run time for the CPU (reduce.cpp). Each is a table of plain
// functions; the loops are written for the compiler to vectorize with whatever the translation
// unit may use.
#pragma once

#include <cstddef>
#include <string_view>

#include "anview/collectives.hpp"

namespace anview::collectives {

struct ReduceKernels {
  std::string_view name;  // "avx512", "avx2", "generic"
  // out[i] = a[i] (op) b[i]; out may be a.
  void (*reduce_to)(void* out, const void* a, const void* b, std::size_t count, DataType type,
                    ReduceOp op);
  // data[i] /= ranks (the end of avg).
  void (*divide)(void* data, std::size_t count, DataType type, int ranks);
};

// Every kernel set built into this binary; null where the build has none for that ISA.
const ReduceKernels* generic_kernels();
const ReduceKernels* avx2_kernels();
const ReduceKernels* avx512_kernels();

}  // namespace anview::collectives
