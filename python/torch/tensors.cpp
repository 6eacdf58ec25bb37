#include "tensors.hpp"

#include <utility>

namespace anview::torch_backend {

void refuse(const char* operation, int rank, std::string cause) {
  throw Error(
      ErrorKind::usage,
      {.rank = rank, .operation = std::string("torch ") + operation, .cause = std::move(cause)});
}

DataType element_type(const at::Tensor& tensor, const char* operation, int rank) {
  switch (tensor.scalar_type()) {
    case at::kChar:
      return DataType::int8;
    case at::kByte:
      return DataType::uint8;
    case at::kBool:
      return DataType::uint8;
    case at::kInt:
      return DataType::int32;
    case at::kLong:
      return DataType::int64;
    case at::kHalf:
      return DataType::float16;
    case at::kBFloat16:
      return DataType::bfloat16;
    case at::kFloat:
      return DataType::float32;
    case at::kDouble:
      return DataType::float64;
    default:
      refuse(operation, rank,
             std::string("tensors of type ") + c10::toString(tensor.scalar_type()) +
                 " are not supported (int8, uint8, bool, int32, int64, float16, bfloat16, "
                 "float32, float64 are)");
  }
}

ReduceOp reduce_op(const c10d::ReduceOp& op, const at::Tensor& tensor, const char* operation,
                   int rank) {
  const bool is_bool = tensor.scalar_type() == at::kBool;
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return is_bool ? ReduceOp::max : ReduceOp::sum;
    case c10d::ReduceOp::PRODUCT:
      return is_bool ? ReduceOp::min : ReduceOp::prod;
    case c10d::ReduceOp::MIN:
      return ReduceOp::min;
    case c10d::ReduceOp::MAX:
      return ReduceOp::max;
    case c10d::ReduceOp::BAND:
      return ReduceOp::band;
    case c10d::ReduceOp::BOR:
      return ReduceOp::bor;
    case c10d::ReduceOp::BXOR:
      return ReduceOp::bxor;
    case c10d::ReduceOp::AVG:
      if (is_bool) refuse(operation, rank, "ReduceOp.AVG of bool tensors");
      return ReduceOp::avg;
    default:
      refuse(operation, rank,
             "ReduceOp " + std::to_string(static_cast<int>(op.op_)) +
                 " is not supported (SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR, BXOR are; "
                 "PREMUL_SUM is NCCL's only)");
  }
}

void check_cpu_dense(const at::Tensor& tensor, const char* operation, int rank) {
  if (!tensor.defined()) refuse(operation, rank, "an undefined tensor");
  if (!tensor.device().is_cpu())
    refuse(operation, rank,
           "a tensor on " + tensor.device().str() + "; the anview backend moves CPU tensors");
  if (tensor.layout() != at::kStrided) refuse(operation, rank, "a sparse tensor");
}

const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* operation, int rank) {
  if (tensors.size() != 1)
    refuse(operation, rank,
           std::to_string(tensors.size()) + " tensors in the list; the anview backend takes one");
  check_cpu_dense(tensors[0], operation, rank);
  return tensors[0];
}

void check_same(const std::vector<at::Tensor>& tensors, const at::Tensor& like,
                const char* operation, int rank) {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    check_cpu_dense(tensors[i], operation, rank);
    if (tensors[i].scalar_type() != like.scalar_type())
      refuse(operation, rank,
             "tensor " + std::to_string(i) + " is " + c10::toString(tensors[i].scalar_type()) +
                 ", the input " + c10::toString(like.scalar_type()));
    if (tensors[i].numel() != like.numel())
      refuse(operation, rank,
             "tensor " + std::to_string(i) + " has " + std::to_string(tensors[i].numel()) +
                 " elements, the input " + std::to_string(like.numel()));
  }
}

at::Tensor flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

void unflatten(const at::Tensor& flat, const std::vector<at::Tensor>& tensors) {
  std::int64_t offset = 0;
  for (const auto& t : tensors) {
    t.copy_(flat.narrow(0, offset, t.numel()).view_as(t));
    offset += t.numel();
  }
}

}  // namespace anview::torch_backend
