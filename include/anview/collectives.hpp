// Element types and reduction operations of the collectives (Communicator::allreduce, ...).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace anview {

enum class DataType : std::uint8_t {
  int8,
  uint8,
  int32,
  uint32,
  int64,
  uint64,
  float16,   // IEEE binary16, accumulated in float
  bfloat16,  // accumulated in float
  float32,
  float64,
};

// avg is sum divided by the number of ranks (integer division for integer types). band, bor
// and bxor exist for integer types only; other combinations are a usage Error at the call.
enum class ReduceOp : std::uint8_t { sum, prod, min, max, avg, band, bor, bxor };

// Bytes per element; 0 for a value outside the enumeration. Inline: every call asks.
constexpr std::size_t size_of(DataType type) {
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
std::string_view name_of(DataType type);
std::string_view name_of(ReduceOp op);
// The inverse of name_of ("bfloat16" -> DataType::bfloat16); nullopt for an unknown name.
std::optional<DataType> data_type_named(std::string_view name);
std::optional<ReduceOp> reduce_op_named(std::string_view name);

}  // namespace anview
