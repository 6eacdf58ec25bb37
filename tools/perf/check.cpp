#include "check.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace perf {
namespace {

using anview::DataType;
using anview::ReduceOp;

bool is_float(DataType t) {
  return t == DataType::float16 || t == DataType::bfloat16 || t == DataType::float32 ||
         t == DataType::float64;
}

bool reducing(const std::string& op) {
  return op == "allreduce" || op == "reduce" || op == "reduce_scatter";
}

// Rank r's input element i: small positive integers, exact in every type (bfloat16 holds
// integers up to 256 exactly, float16 up to 2048).
std::int64_t input(const CheckCase& c, int r, std::size_t i) {
  const auto rank = static_cast<std::size_t>(r);
  if (!reducing(c.op)) return static_cast<std::int64_t>((7 * rank + i) % 101 + 1);
  switch (c.redop) {
    case ReduceOp::prod: {  // one 2 and one 3 per element, wherever they fall: a product of 6
      const std::size_t k = (rank + i) % static_cast<std::size_t>(c.ranks);
      return k == 0 ? 2 : k == 1 ? 3 : 1;
    }
    case ReduceOp::band:
    case ReduceOp::bor:
    case ReduceOp::bxor:
      return static_cast<std::int64_t>((37 * rank + 11 * i + 5) & 0x7F);
    case ReduceOp::min:
    case ReduceOp::max:
      return static_cast<std::int64_t>((3 * rank + i) % 11 + 1);
    case ReduceOp::sum:
    case ReduceOp::avg:
      break;
  }
  return static_cast<std::int64_t>((rank + i) % 3 + 1);
}

// An integer as an element of `t` holds it: wrapped to the type's width, as the reduction
// kernels' arithmetic wraps (C++20 conversions are modular).
std::int64_t wrap(DataType t, std::int64_t v) {
  switch (t) {
    case DataType::int8:
      return static_cast<std::int8_t>(v);
    case DataType::uint8:
      return static_cast<std::uint8_t>(v);
    case DataType::int32:
      return static_cast<std::int32_t>(v);
    case DataType::uint32:
      return static_cast<std::uint32_t>(v);
    default:
      return v;
  }
}

std::uint16_t to_half(float f) {  // exact for the small integers input() makes
  if (f == 0) return 0;
  const auto bits = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t exponent = ((bits >> 23) & 0xFF) - 127 + 15;
  return static_cast<std::uint16_t>(((bits >> 16) & 0x8000) | (exponent << 10) |
                                    ((bits >> 13) & 0x3FF));
}

double from_half(std::uint16_t h) {
  const int exponent = (h >> 10) & 0x1F;
  const int mantissa = h & 0x3FF;
  double v = exponent == 0    ? std::ldexp(mantissa, -24)
             : exponent == 31 ? (mantissa != 0 ? NAN : INFINITY)
                              : std::ldexp(mantissa + 1024, exponent - 25);
  return (h & 0x8000) != 0 ? -v : v;
}

template <typename T>
T read(const void* buf, std::size_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(buf) + i * sizeof(T), sizeof(T));
  return v;
}

template <typename T>
void write(void* buf, std::size_t i, T v) {
  std::memcpy(static_cast<char*>(buf) + i * sizeof(T), &v, sizeof(T));
}

void store(DataType t, void* buf, std::size_t i, std::int64_t v) {
  switch (t) {
    case DataType::int8:
      return write(buf, i, static_cast<std::int8_t>(v));
    case DataType::uint8:
      return write(buf, i, static_cast<std::uint8_t>(v));
    case DataType::int32:
      return write(buf, i, static_cast<std::int32_t>(v));
    case DataType::uint32:
      return write(buf, i, static_cast<std::uint32_t>(v));
    case DataType::int64:
      return write(buf, i, v);
    case DataType::uint64:
      return write(buf, i, static_cast<std::uint64_t>(v));
    case DataType::float16:
      return write(buf, i, to_half(static_cast<float>(v)));
    case DataType::bfloat16:
      return write(
          buf, i,
          static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(static_cast<float>(v)) >> 16));
    case DataType::float32:
      return write(buf, i, static_cast<float>(v));
    case DataType::float64:
      return write(buf, i, static_cast<double>(v));
  }
}

std::int64_t load_integer(DataType t, const void* buf, std::size_t i) {
  switch (t) {
    case DataType::int8:
      return read<std::int8_t>(buf, i);
    case DataType::uint8:
      return read<std::uint8_t>(buf, i);
    case DataType::int32:
      return read<std::int32_t>(buf, i);
    case DataType::uint32:
      return read<std::uint32_t>(buf, i);
    case DataType::uint64:
      return static_cast<std::int64_t>(read<std::uint64_t>(buf, i));
    default:
      return read<std::int64_t>(buf, i);
  }
}

double load_float(DataType t, const void* buf, std::size_t i) {
  switch (t) {
    case DataType::float16:
      return from_half(read<std::uint16_t>(buf, i));
    case DataType::bfloat16:
      return std::bit_cast<float>(static_cast<std::uint32_t>(read<std::uint16_t>(buf, i)) << 16);
    case DataType::float32:
      return read<float>(buf, i);
    default:
      return read<double>(buf, i);
  }
}

// Relative tolerance: an avg rounds once (a quotient); every other result is an exact integer.
double tolerance(DataType t) {
  switch (t) {
    case DataType::float16:
      return 1e-3;
    case DataType::bfloat16:
      return 8e-3;
    case DataType::float32:
      return 1e-6;
    default:
      return 1e-12;
  }
}

// The reduction over every rank's element i, in int64 or double.
template <typename T>
T fold(const CheckCase& c, std::size_t i) {
  auto acc = static_cast<T>(input(c, 0, i));
  for (int r = 1; r < c.ranks; ++r) {
    const auto v = static_cast<T>(input(c, r, i));
    switch (c.redop) {
      case ReduceOp::sum:
      case ReduceOp::avg:
        acc += v;
        break;
      case ReduceOp::prod:
        acc *= v;
        break;
      case ReduceOp::min:
        acc = std::min(acc, v);
        break;
      case ReduceOp::max:
        acc = std::max(acc, v);
        break;
      case ReduceOp::band:
      case ReduceOp::bor:
      case ReduceOp::bxor:
        if constexpr (std::is_integral_v<T>) {  // refused for floating-point types
          acc = c.redop == ReduceOp::band ? acc & v : c.redop == ReduceOp::bor ? acc | v : acc ^ v;
        }
        break;
    }
  }
  return acc;
}

// As an integer type's element holds it: the sum wraps before avg divides it, as the kernels'.
std::int64_t reduced_integer(const CheckCase& c, std::size_t i) {
  const std::int64_t acc = wrap(c.type, fold<std::int64_t>(c, i));
  return c.redop == ReduceOp::avg ? wrap(c.type, acc / c.ranks) : acc;
}

double reduced_float(const CheckCase& c, std::size_t i) {
  const double acc = fold<double>(c, i);
  return c.redop == ReduceOp::avg ? acc / c.ranks : acc;
}

}  // namespace

std::size_t send_elements(const CheckCase& c) {
  const bool blocks = c.op == "reduce_scatter" || c.op == "alltoall";
  return blocks ? c.count * static_cast<std::size_t>(c.ranks) : c.count;
}

void fill_send(const CheckCase& c, void* send) {
  const std::size_t n = send_elements(c);
  for (std::size_t i = 0; i < n; ++i) store(c.type, send, i, input(c, c.rank, i));
}

long count_wrong(const CheckCase& c, const void* send, const void* recv) {
  const bool floating = is_float(c.type);
  const double tol = tolerance(c.type);
  long wrong = 0;
  // Element `at` of `buf` against rank r's input element i, or the reduction of element i.
  auto check = [&](const void* buf, std::size_t at, bool reduction, int r, std::size_t i) {
    if (floating) {
      const double want = reduction ? reduced_float(c, i) : static_cast<double>(input(c, r, i));
      const double got = load_float(c.type, buf, at);
      if (!(std::abs(got - want) <= tol * std::max(1.0, std::abs(want)))) ++wrong;
    } else {
      const std::int64_t want = reduction ? reduced_integer(c, i) : wrap(c.type, input(c, r, i));
      if (load_integer(c.type, buf, at) != want) ++wrong;
    }
  };
  const std::size_t count = c.count;
  const auto me = static_cast<std::size_t>(c.rank);
  if (c.op == "allreduce" || (c.op == "reduce" && c.rank == c.root)) {
    for (std::size_t i = 0; i < count; ++i) check(recv, i, true, 0, i);
  } else if (c.op == "reduce_scatter") {
    for (std::size_t k = 0; k < count; ++k) check(recv, k, true, 0, me * count + k);
  } else if (c.op == "broadcast") {
    for (std::size_t i = 0; i < count; ++i) check(send, i, false, c.root, i);
  } else if (c.op == "allgather") {
    for (int r = 0; r < c.ranks; ++r)
      for (std::size_t k = 0; k < count; ++k)
        check(recv, static_cast<std::size_t>(r) * count + k, false, r, k);
  } else if (c.op == "alltoall") {
    for (int r = 0; r < c.ranks; ++r)
      for (std::size_t k = 0; k < count; ++k)
        check(recv, static_cast<std::size_t>(r) * count + k, false, r, me * count + k);
  }
  return wrong;
}

}  // namespace perf
