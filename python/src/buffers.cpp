#include "buffers.hpp"

#include <utility>
#include <vector>

namespace anview::python {
namespace {

// The element type a struct-module format character names ('<f', '=i', 'e', ...).
std::optional<DataType> type_of_format(std::string format, std::size_t item_size) {
  if (!format.empty() && std::string("@=<!").find(format[0]) != std::string::npos)
    format.erase(0, 1);
  if (format.size() != 1) return std::nullopt;
  const char f = format[0];
  const bool is_signed = std::string("bhilq").find(f) != std::string::npos;
  const bool is_unsigned = std::string("BHILQ").find(f) != std::string::npos;
  if (f == 'f' && item_size == 4) return DataType::float32;
  if (f == 'd' && item_size == 8) return DataType::float64;
  if (f == 'e' && item_size == 2) return DataType::float16;
  if (f == 'c') return DataType::uint8;
  if (is_signed || is_unsigned) {
    switch (item_size) {
      case 1:
        return is_signed ? DataType::int8 : DataType::uint8;
      case 4:
        return is_signed ? DataType::int32 : DataType::uint32;
      case 8:
        return is_signed ? DataType::int64 : DataType::uint64;
      default:
        return std::nullopt;  // 16-bit integers: no collective type (see dtype=)
    }
  }
  return std::nullopt;
}

}  // namespace

void usage_error(const char* operation, int rank, std::string cause) {
  throw Error(ErrorKind::usage, {.rank = rank, .operation = operation, .cause = std::move(cause)});
}

DataType parse_dtype(const std::string& name, const char* operation, int rank) {
  if (const auto type = data_type_named(name)) return *type;
  usage_error(operation, rank,
              "unknown dtype '" + name +
                  "' (int8, uint8, int32, uint32, int64, uint64, float16, bfloat16, float32, "
                  "float64)");
}

ReduceOp parse_op(const std::string& name, const char* operation, int rank) {
  if (const auto op = reduce_op_named(name)) return *op;
  usage_error(operation, rank,
              "unknown reduction '" + name + "' (sum, prod, min, max, avg, band, bor, bxor)");
}

namespace {

struct Kept {
  Request request;
  std::vector<HeldBuffer> buffers;
};

// Never destroyed: at interpreter exit the buffers must not be released without the GIL.
std::vector<Kept>& kept() {
  static auto* list = new std::vector<Kept>;
  return *list;
}

void release_ended() {
  auto& list = kept();
  std::erase_if(list, [](const Kept& k) { return k.request.done(); });
}

}  // namespace

void keep_until_done(Request request, std::vector<HeldBuffer> buffers) {
  kept().push_back(Kept{std::move(request), std::move(buffers)});
}

HeldBuffer hold(const py::object& object, bool writable, const std::optional<std::string>& dtype,
                const char* operation, const char* argument, int rank) {
  if (!kept().empty()) release_ended();
  if (!PyObject_CheckBuffer(object.ptr()))
    usage_error(operation, rank,
                std::string(argument) + " is a " +
                    std::string(py::str(object.get_type().attr("__name__"))) +
                    ", not a buffer (a numpy array, bytes, bytearray or memoryview)");
  // pybind11's buffer_info keeps the pointer and, owning it, releases and deletes it.
  auto view = std::make_unique<Py_buffer>();
  const int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(object.ptr(), view.get(), flags) != 0) {
    PyErr_Clear();
    usage_error(operation, rank,
                std::string(argument) + " must be a C-contiguous" + (writable ? " writable" : "") +
                    " buffer");
  }
  HeldBuffer held;
  held.info = std::make_shared<py::buffer_info>(view.release(), /*ownview=*/true);
  const auto item_size = static_cast<std::size_t>(held.info->itemsize);
  const auto total = static_cast<std::size_t>(held.info->size) * item_size;
  if (dtype) {
    held.type = parse_dtype(*dtype, operation, rank);
    if (size_of(held.type) != item_size && held.info->format != "B" && held.info->format != "b")
      usage_error(operation, rank,
                  std::string(argument) + " has " + std::to_string(item_size) +
                      "-byte elements, but dtype " + *dtype + " has " +
                      std::to_string(size_of(held.type)));
  } else {
    const auto type = type_of_format(held.info->format, item_size);
    if (!type)
      usage_error(operation, rank,
                  std::string(argument) + " has elements of format '" + held.info->format + "' (" +
                      std::to_string(item_size) +
                      " bytes), which no collective type matches; pass dtype=");
    held.type = *type;
  }
  if (total % size_of(held.type) != 0)
    usage_error(operation, rank,
                std::string(argument) + " holds " + std::to_string(total) +
                    " bytes, not a whole number of " + std::string(name_of(held.type)));
  held.count = total / size_of(held.type);
  return held;
}

}  // namespace anview::python
