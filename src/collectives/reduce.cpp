#include "collectives/reduce.hpp"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <optional>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "anview/error.hpp"
#include "base/config.hpp"
#include "base/log.hpp"
#include "collectives/reduce_kernels.hpp"

namespace anview {

namespace {

constexpr std::string_view type_names[] = {"int8",   "uint8",   "int32",    "uint32",  "int64",
                                           "uint64", "float16", "bfloat16", "float32", "float64"};
constexpr std::string_view op_names[] = {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor"};

template <typename Enum, std::size_t N>
std::optional<Enum> lookup(const std::string_view (&names)[N], std::string_view name) {
  for (std::size_t i = 0; i < N; ++i)
    if (names[i] == name) return static_cast<Enum>(i);
  return std::nullopt;
}

}  // namespace

std::string_view name_of(DataType type) {
  const auto i = static_cast<std::size_t>(type);
  return i < std::size(type_names) ? type_names[i] : "unknown";
}

std::string_view name_of(ReduceOp op) {
  const auto i = static_cast<std::size_t>(op);
  return i < std::size(op_names) ? op_names[i] : "unknown";
}

std::optional<DataType> data_type_named(std::string_view name) {
  return lookup<DataType>(type_names, name);
}

std::optional<ReduceOp> reduce_op_named(std::string_view name) {
  return lookup<ReduceOp>(op_names, name);
}

}  // namespace anview

namespace anview::collectives {
namespace {

const base::Setting kernels_setting(
    "collectives", "ANVIEW_CPU_KERNELS", "auto",
    "Reduction kernels: auto (the widest this CPU runs), avx512, avx2 or generic");

bool is_integer(DataType t) {
  return t == DataType::int8 || t == DataType::uint8 || t == DataType::int32 ||
         t == DataType::uint32 || t == DataType::int64 || t == DataType::uint64;
}

bool cpu_runs(std::string_view name) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  // F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports has no "f16c".
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  const bool avx2 = __builtin_cpu_supports("avx2") && f16c;
  if (name == "avx2") return avx2;
  if (name == "avx512") {
    return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
  }
#endif
  return name == "generic";
}

const ReduceKernels& choose_kernels() {
  const std::string wanted = kernels_setting.value();
  static constexpr std::string_view widest_first[] = {"avx512", "avx2", "generic"};
  if (wanted != "auto" && std::find(std::begin(widest_first), std::end(widest_first), wanted) ==
                              std::end(widest_first)) {
    throw Error(ErrorKind::usage, {.operation = "configuration",
                                   .cause = "ANVIEW_CPU_KERNELS=" + wanted +
                                            ": expected auto, avx512, avx2 or generic"});
  }
  bool reached = wanted == "auto";
  for (std::string_view name : widest_first) {
    reached = reached || name == wanted;
    if (!reached) continue;
    if (const ReduceKernels* k = reduce_kernels(name)) {
      if (name != wanted && wanted != "auto")
        base::log("coll", base::LogLevel::warn, "ANVIEW_CPU_KERNELS=", wanted,
                  ": this CPU or build lacks it; using ", name);
      return *k;
    }
  }
  return *generic_kernels();
}

const ReduceKernels& active_kernels() {
  static const ReduceKernels& kernels = choose_kernels();
  return kernels;
}

}  // namespace

const ReduceKernels* reduce_kernels(std::string_view name) {
  if (!cpu_runs(name)) return nullptr;
  if (name == "avx512") return avx512_kernels();
  if (name == "avx2") return avx2_kernels();
  return generic_kernels();
}

std::string_view reduce_kernels_name() {
  return active_kernels().name;
}

std::string unsupported(DataType type, ReduceOp op) {
  if (size_of(type) == 0) return "unknown data type";
  if (static_cast<unsigned>(op) > static_cast<unsigned>(ReduceOp::bxor)) return "unknown operation";
  if ((op == ReduceOp::band || op == ReduceOp::bor || op == ReduceOp::bxor) && !is_integer(type)) {
    return std::string(name_of(op)) + " is defined for integer types only, not " +
           std::string(name_of(type));
  }
  return {};
}

void reduce_to(void* out, const void* a, const void* b, std::size_t n, DataType type, ReduceOp op) {
  active_kernels().reduce_to(out, a, b, n, type, op);
}

void reduce_into(void* acc, const void* in, std::size_t n, DataType type, ReduceOp op) {
  active_kernels().reduce_to(acc, acc, in, n, type, op);
}

void finish_avg(void* data, std::size_t n, DataType type, int ranks) {
  active_kernels().divide(data, n, type, ranks);
}

}  // namespace anview::collectives
