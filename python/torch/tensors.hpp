// Tensors as Anview buffers: element types, reduction operations, and the checks every
// operation of the backend makes before it starts (dense CPU tensors of a supported type).
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstddef>
#include <string>
#include <vector>

#include "anview/anview.hpp"

namespace anview::torch_backend {

// The usage Error of a call the backend refuses; `operation` is torch's name ("all_reduce").
[[noreturn]] void refuse(const char* operation, int rank, std::string cause);

// int8, uint8, int32, int64, float16, bfloat16, float32, float64; bool as uint8 (its sum and
// prod are logical or and and, as NCCL does). Anything else is refused.
DataType element_type(const at::Tensor& tensor, const char* operation, int rank);
ReduceOp reduce_op(const c10d::ReduceOp& op, const at::Tensor& tensor, const char* operation,
                   int rank);

// The one tensor of a single-tensor list (torch passes lists for multi-device calls), a dense
// CPU tensor.
const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* operation, int rank);
void check_cpu_dense(const at::Tensor& tensor, const char* operation, int rank);
// Every tensor of `tensors` has the type and element count of `like`.
void check_same(const std::vector<at::Tensor>& tensors, const at::Tensor& like,
                const char* operation, int rank);

// The tensors one after another in one contiguous 1-D tensor, and back.
at::Tensor flatten(const std::vector<at::Tensor>& tensors);
void unflatten(const at::Tensor& flat, const std::vector<at::Tensor>& tensors);

inline std::size_t count_of(const at::Tensor& t) {
  return static_cast<std::size_t>(t.numel());
}

}  // namespace anview::torch_backend
