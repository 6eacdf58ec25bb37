// anview._torch: the creator function torch.distributed calls for the "anview" backend
// (registered by anview/torch.py).
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include "process_group.hpp"

PYBIND11_MODULE(_torch, m) {
  namespace py = pybind11;
  m.doc() = "The PyTorch c10d backend of Anview (use: import anview.torch).";
  m.def(
      "create_process_group",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
         std::chrono::milliseconds timeout) {
        return anview::torch_backend::ProcessGroupAnview::create(store, rank, size, timeout);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
      py::call_guard<py::gil_scoped_release>(),
      "Bootstraps an Anview communicator of `size` ranks through torch's store and returns it "
      "as a c10d ProcessGroup.");
}
