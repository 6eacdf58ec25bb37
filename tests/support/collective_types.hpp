// Every element type and every reduction of the collectives, for tests that sweep them all.
#pragma once

#include "anview/collectives.hpp"

namespace anview::testing {

inline constexpr DataType every_data_type[] = {
    DataType::int8,   DataType::uint8,   DataType::int32,    DataType::uint32,  DataType::int64,
    DataType::uint64, DataType::float16, DataType::bfloat16, DataType::float32, DataType::float64};
inline constexpr ReduceOp every_reduce_op[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min,
                                               ReduceOp::max, ReduceOp::avg,  ReduceOp::band,
                                               ReduceOp::bor, ReduceOp::bxor};

}  // namespace anview::testing
