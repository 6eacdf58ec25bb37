// The kernels for x86-64 CPUs with AVX512 and F16C, built with those instructions enabled
// (CMakeLists.txt) and used only where the CPU has them (reduce.cpp).
#define ANVIEW_KERNELS_NAME "avx512"
#define ANVIEW_KERNELS_GETTER avx512_kernels
#define ANVIEW_KERNELS_X86
#include "collectives/reduce_kernels.inc"
