// The reduction kernel sets (generic, AVX2, AVX-512): every set this CPU runs gives the same
// bits as the generic one, for every type and operation, at lengths that exercise the vector
// bodies and the scalar tails, out of place and in place; and ANVIEW_CPU_KERNELS is checked.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "collectives/reduce.hpp"
#include "collectives/reduce_kernels.hpp"
#include "support/collective_types.hpp"

namespace anview {
namespace {

using collectives::ReduceKernels;
using testing::every_data_type;
using testing::every_reduce_op;

const std::size_t lengths[] = {0, 1, 7, 8, 15, 16, 17, 63, 255, 256, 257, 1000, 4099};

// Random values of `type`: floats of mixed sign and magnitude (including halves that round),
// integers over their whole range.
std::vector<char> random_values(DataType type, std::size_t n, std::mt19937& rng) {
  const std::size_t esize = size_of(type);
  std::vector<char> buf(n * esize);
  std::uniform_real_distribution<float> real(-1000.0f, 1000.0f);
  for (std::size_t i = 0; i < n; ++i) {
    char* at = buf.data() + i * esize;
    switch (type) {
      case DataType::float16: {
        const std::uint16_t h = collectives::float_to_half(real(rng));
        std::memcpy(at, &h, 2);
        break;
      }
      case DataType::bfloat16: {
        const std::uint16_t h = collectives::float_to_bfloat16(real(rng));
        std::memcpy(at, &h, 2);
        break;
      }
      case DataType::float32: {
        const float f = real(rng);
        std::memcpy(at, &f, 4);
        break;
      }
      case DataType::float64: {
        const double d = real(rng) * 1.0e-3;
        std::memcpy(at, &d, 8);
        break;
      }
      default:
        for (std::size_t b = 0; b < esize; ++b) at[b] = static_cast<char>(rng());
    }
  }
  return buf;
}

std::vector<const ReduceKernels*> runnable_sets() {
  std::vector<const ReduceKernels*> sets;
  for (const char* name : {"avx2", "avx512"})
    if (const auto* k = collectives::reduce_kernels(name)) sets.push_back(k);
  return sets;
}

TEST(ReduceKernelSets, GenericIsAlwaysThere) {
  const ReduceKernels* generic = collectives::reduce_kernels("generic");
  ASSERT_NE(generic, nullptr);
  EXPECT_EQ(generic->name, "generic");
  EXPECT_EQ(collectives::reduce_kernels("sse9"), nullptr);
  const std::string_view active = collectives::reduce_kernels_name();
  EXPECT_TRUE(active == "generic" || active == "avx2" || active == "avx512") << active;
}

TEST(ReduceKernelSets, EverySetMatchesGenericBitForBit) {
  const ReduceKernels* generic = collectives::reduce_kernels("generic");
  const auto sets = runnable_sets();
  if (sets.empty()) GTEST_SKIP() << "this CPU runs the generic kernels only";
  std::mt19937 rng(42);
  for (DataType type : every_data_type) {
    for (ReduceOp op : every_reduce_op) {
      if (!collectives::unsupported(type, op).empty()) continue;
      for (std::size_t n : lengths) {
        const auto a = random_values(type, n, rng);
        const auto b = random_values(type, n, rng);
        std::vector<char> want(a.size());
        generic->reduce_to(want.data(), a.data(), b.data(), n, type, op);
        if (op == ReduceOp::avg) generic->divide(want.data(), n, type, 3);
        for (const ReduceKernels* set : sets) {
          std::vector<char> got(a.size());
          set->reduce_to(got.data(), a.data(), b.data(), n, type, op);
          std::vector<char> in_place = a;  // out == a
          set->reduce_to(in_place.data(), in_place.data(), b.data(), n, type, op);
          if (op == ReduceOp::avg) {
            set->divide(got.data(), n, type, 3);
            set->divide(in_place.data(), n, type, 3);
          }
          const std::string what = std::string(set->name) + " " + std::string(name_of(type)) + " " +
                                   std::string(name_of(op)) + " n=" + std::to_string(n);
          EXPECT_EQ(got, want) << what;
          EXPECT_EQ(in_place, want) << what << " in place";
        }
      }
    }
  }
}

// avg over more ranks than a small integer type holds: the divisor is the rank count, not the
// rank count cast to the element type (128 was -128 in an int8; 256 was 0 in a uint8, a
// division by zero that killed the process).
TEST(ReduceKernelSets, AvgDividesByRankCountsTheElementTypeCannotHold) {
  std::vector<const ReduceKernels*> sets = runnable_sets();
  sets.push_back(collectives::reduce_kernels("generic"));
  for (const ReduceKernels* set : sets) {
    std::vector<std::int8_t> i8 = {-128, 127, -100};
    set->divide(i8.data(), i8.size(), DataType::int8, 128);
    EXPECT_EQ(i8, (std::vector<std::int8_t>{-1, 0, 0})) << set->name;
    std::vector<std::uint8_t> u8 = {255, 200, 0};
    set->divide(u8.data(), u8.size(), DataType::uint8, 256);
    EXPECT_EQ(u8, (std::vector<std::uint8_t>{0, 0, 0})) << set->name;
    std::vector<std::uint8_t> small = {255, 100};
    set->divide(small.data(), small.size(), DataType::uint8, 5);
    EXPECT_EQ(small, (std::vector<std::uint8_t>{51, 20})) << set->name;
  }
}

TEST(ReduceKernelSets, HalfNanAndInfinityAgreeWithGeneric) {
  const ReduceKernels* generic = collectives::reduce_kernels("generic");
  // inf + -inf is nan; nan payloads stay quiet nans; overflow becomes infinity.
  const std::vector<std::uint16_t> a = {0x7C00, 0x7E01, 0x7BFF, 0x0001, 0x8000,
                                        0x3C00, 0x7C00, 0xFC00, 0x0400, 0x03FF};
  const std::vector<std::uint16_t> b = {0xFC00, 0x3C00, 0x7BFF, 0x0001, 0x0000,
                                        0x3C00, 0x3C00, 0xFC00, 0x8001, 0x0001};
  std::vector<std::uint16_t> want(a.size());
  generic->reduce_to(want.data(), a.data(), b.data(), a.size(), DataType::float16, ReduceOp::sum);
  EXPECT_TRUE(std::isnan(collectives::half_to_float(want[0])));
  EXPECT_TRUE(std::isnan(collectives::half_to_float(want[1])));
  EXPECT_TRUE(std::isinf(collectives::half_to_float(want[2])));
  EXPECT_EQ(want[3], 0x0002);  // subnormals add exactly
  for (const ReduceKernels* set : runnable_sets()) {
    std::vector<std::uint16_t> got(a.size());
    set->reduce_to(got.data(), a.data(), b.data(), a.size(), DataType::float16, ReduceOp::sum);
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (std::isnan(collectives::half_to_float(want[i])))
        EXPECT_TRUE(std::isnan(collectives::half_to_float(got[i]))) << set->name << " " << i;
      else
        EXPECT_EQ(got[i], want[i]) << set->name << " " << i;
    }
  }
}

}  // namespace
}  // namespace anview
