#include "collectives/reduce.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace anview {

std::size_t size_of(DataType type) {
  switch (type) {
    case DataType::int8:
    case DataType::uint8:
      return 1;
    case DataType::float16:
    case DataType::bfloat16:
      return 2;
    case DataType::int32:
    case DataType::uint32:
    case DataType::float32:
      return 4;
    case DataType::int64:
    case DataType::uint64:
    case DataType::float64:
      return 8;
  }
  return 0;
}

std::string_view name_of(DataType type) {
  static constexpr std::string_view names[] = {"int8",    "uint8",  "int32",   "uint32",
                                               "int64",   "uint64", "float16", "bfloat16",
                                               "float32", "float64"};
  const auto i = static_cast<std::size_t>(type);
  return i < std::size(names) ? names[i] : "unknown";
}

std::string_view name_of(ReduceOp op) {
  static constexpr std::string_view names[] = {"sum", "prod", "min", "max",
                                               "avg", "band", "bor", "bxor"};
  const auto i = static_cast<std::size_t>(op);
  return i < std::size(names) ? names[i] : "unknown";
}

}  // namespace anview

namespace anview::collectives {
namespace {

bool is_integer(DataType t) {
  return t == DataType::int8 || t == DataType::uint8 || t == DataType::int32 ||
         t == DataType::uint32 || t == DataType::int64 || t == DataType::uint64;
}

template <typename T>
T combine(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return static_cast<T>(a + b);
    case ReduceOp::prod:
      return static_cast<T>(a * b);
    case ReduceOp::min:
      return std::min(a, b);
    case ReduceOp::max:
      return std::max(a, b);
    case ReduceOp::band:
      if constexpr (std::is_integral_v<T>) return static_cast<T>(a & b);
      break;
    case ReduceOp::bor:
      if constexpr (std::is_integral_v<T>) return static_cast<T>(a | b);
      break;
    case ReduceOp::bxor:
      if constexpr (std::is_integral_v<T>) return static_cast<T>(a ^ b);
      break;
  }
  return a;
}

// One loop per op, so each is a plain vectorizable loop (the switch is outside it).
template <typename T>
void reduce_typed(T* acc, const T* in, std::size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      for (std::size_t i = 0; i < n; ++i) acc[i] = combine(acc[i], in[i], ReduceOp::sum);
      return;
    case ReduceOp::prod:
      for (std::size_t i = 0; i < n; ++i) acc[i] = combine(acc[i], in[i], ReduceOp::prod);
      return;
    case ReduceOp::min:
      for (std::size_t i = 0; i < n; ++i) acc[i] = combine(acc[i], in[i], ReduceOp::min);
      return;
    case ReduceOp::max:
      for (std::size_t i = 0; i < n; ++i) acc[i] = combine(acc[i], in[i], ReduceOp::max);
      return;
    case ReduceOp::band:
      for (std::size_t i = 0; i < n; ++i) acc[i] = combine(acc[i], in[i], ReduceOp::band);
      return;
    case ReduceOp::bor:
      for (std::size_t i = 0; i < n; ++i) acc[i] = combine(acc[i], in[i], ReduceOp::bor);
      return;
    case ReduceOp::bxor:
      for (std::size_t i = 0; i < n; ++i) acc[i] = combine(acc[i], in[i], ReduceOp::bxor);
      return;
  }
}

template <float (*to_float)(std::uint16_t), std::uint16_t (*from_float)(float)>
void reduce_16(std::uint16_t* acc, const std::uint16_t* in, std::size_t n, ReduceOp op) {
  constexpr std::size_t block = 256;
  float a[block], b[block];
  for (std::size_t base = 0; base < n; base += block) {
    const std::size_t m = std::min(block, n - base);
    for (std::size_t i = 0; i < m; ++i) {
      a[i] = to_float(acc[base + i]);
      b[i] = to_float(in[base + i]);
    }
    reduce_typed(a, b, m, op);
    for (std::size_t i = 0; i < m; ++i) acc[base + i] = from_float(a[i]);
  }
}

template <typename T>
void divide(T* data, std::size_t n, int ranks) {
  for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<T>(data[i] / static_cast<T>(ranks));
}

template <float (*to_float)(std::uint16_t), std::uint16_t (*from_float)(float)>
void divide_16(std::uint16_t* data, std::size_t n, int ranks) {
  for (std::size_t i = 0; i < n; ++i)
    data[i] = from_float(to_float(data[i]) / static_cast<float>(ranks));
}

}  // namespace

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exponent = (h >> 10) & 0x1Fu;
  std::uint32_t mantissa = h & 0x3FFu;
  std::uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);  // inf or nan
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;  // zero
  } else {        // subnormal: normalise
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3FFu) << 13);
  }
  return std::bit_cast<float>(bits);
}

std::uint16_t float_to_half(float f) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // inf or nan (keep nan a nan)
    return static_cast<std::uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // overflow
  if (abs < 0x38800000u) {  // subnormal or zero in half: round to nearest even
    const float magnitude = std::bit_cast<float>(abs);
    const auto rounded = static_cast<std::uint32_t>(std::nearbyint(magnitude * 16777216.0f));
    return static_cast<std::uint16_t>(sign | rounded);
  }
  const std::uint32_t rounded = abs + 0xFFFu + ((abs >> 13) & 1u);  // to nearest even
  return static_cast<std::uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

float bfloat16_to_float(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

std::uint16_t float_to_bfloat16(float f) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  return static_cast<std::uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
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

void reduce_into(void* acc, const void* in, std::size_t n, DataType type, ReduceOp op) {
  switch (type) {
    case DataType::int8:
      return reduce_typed(static_cast<std::int8_t*>(acc), static_cast<const std::int8_t*>(in), n,
                          op);
    case DataType::uint8:
      return reduce_typed(static_cast<std::uint8_t*>(acc), static_cast<const std::uint8_t*>(in), n,
                          op);
    case DataType::int32:
      return reduce_typed(static_cast<std::int32_t*>(acc), static_cast<const std::int32_t*>(in), n,
                          op);
    case DataType::uint32:
      return reduce_typed(static_cast<std::uint32_t*>(acc), static_cast<const std::uint32_t*>(in),
                          n, op);
    case DataType::int64:
      return reduce_typed(static_cast<std::int64_t*>(acc), static_cast<const std::int64_t*>(in), n,
                          op);
    case DataType::uint64:
      return reduce_typed(static_cast<std::uint64_t*>(acc), static_cast<const std::uint64_t*>(in),
                          n, op);
    case DataType::float32:
      return reduce_typed(static_cast<float*>(acc), static_cast<const float*>(in), n, op);
    case DataType::float64:
      return reduce_typed(static_cast<double*>(acc), static_cast<const double*>(in), n, op);
    case DataType::float16:
      return reduce_16<half_to_float, float_to_half>(static_cast<std::uint16_t*>(acc),
                                                     static_cast<const std::uint16_t*>(in), n, op);
    case DataType::bfloat16:
      return reduce_16<bfloat16_to_float, float_to_bfloat16>(
          static_cast<std::uint16_t*>(acc), static_cast<const std::uint16_t*>(in), n, op);
  }
}

void finish_avg(void* data, std::size_t n, DataType type, int ranks) {
  switch (type) {
    case DataType::int8:
      return divide(static_cast<std::int8_t*>(data), n, ranks);
    case DataType::uint8:
      return divide(static_cast<std::uint8_t*>(data), n, ranks);
    case DataType::int32:
      return divide(static_cast<std::int32_t*>(data), n, ranks);
    case DataType::uint32:
      return divide(static_cast<std::uint32_t*>(data), n, ranks);
    case DataType::int64:
      return divide(static_cast<std::int64_t*>(data), n, ranks);
    case DataType::uint64:
      return divide(static_cast<std::uint64_t*>(data), n, ranks);
    case DataType::float32:
      return divide(static_cast<float*>(data), n, ranks);
    case DataType::float64:
      return divide(static_cast<double*>(data), n, ranks);
    case DataType::float16:
      return divide_16<half_to_float, float_to_half>(static_cast<std::uint16_t*>(data), n, ranks);
    case DataType::bfloat16:
      return divide_16<bfloat16_to_float, float_to_bfloat16>(static_cast<std::uint16_t*>(data), n,
                                                             ranks);
  }
}

}  // namespace anview::collectives
