// Python buffers (numpy arrays, bytes, bytearray, memoryview, anything with the buffer
// protocol) as the (pointer, element count, DataType) triples the collectives take.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "anview/anview.hpp"

namespace anview::python {

namespace py = pybind11;

// One buffer held for the length of a call (or of a nonblocking operation): the view keeps
// the object from being resized or freed. Must be destroyed with the GIL held.
struct HeldBuffer {
  std::shared_ptr<py::buffer_info> info;
  DataType type = DataType::uint8;
  std::size_t count = 0;  // elements of `type`

  void* data() const { return info->ptr; }
  std::size_t bytes() const { return count * size_of(type); }
};

// Views `object` as a C-contiguous buffer (writable when asked) of elements of its own type,
// or of `dtype` ("bfloat16", "float32", ...) where given, which must have the item size of the
// buffer's elements. Bytes-like objects are uint8. Anything else is a usage Error naming
// `operation` and the argument.
HeldBuffer hold(const py::object& object, bool writable, const std::optional<std::string>& dtype,
                const char* operation, const char* argument, int rank);

// A nonblocking operation whose Request the caller dropped before it ended still uses its
// buffers: they are kept here until it ends, and let go by a later call that takes buffers
// (every call into the module holds the GIL, which guards the list). MPI_Request_free's rule:
// the operation goes on.
void keep_until_done(Request request, std::vector<HeldBuffer> buffers);

DataType parse_dtype(const std::string& name, const char* operation, int rank);
ReduceOp parse_op(const std::string& name, const char* operation, int rank);

[[noreturn]] void usage_error(const char* operation, int rank, std::string cause);

}  // namespace anview::python
