// anview._anview: the public C++ API for Python. Buffers are used in place (zero copy) through
// the buffer protocol; every blocking call releases the GIL; anview::Error becomes
// anview.Error (a RuntimeError) carrying kind, rank, peer, operation and cause.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "anview/anview.hpp"
#include "buffers.hpp"

namespace anview::python {
namespace {

using Seconds = std::optional<double>;
using Counts = std::vector<std::size_t>;

std::optional<std::chrono::milliseconds> to_timeout(const Seconds& seconds, const char* operation) {
  if (!seconds) return std::nullopt;
  if (!std::isfinite(*seconds) || *seconds < 0)
    usage_error(operation, -1, "timeout must be a finite number of seconds >= 0");
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::ceil(*seconds * 1000.0)));
}

// A nonblocking operation and the buffers it uses, held until it ends: a Request dropped
// before that hands them to keep_until_done().
struct PyRequest {
  PyRequest(Request r, std::vector<HeldBuffer> b) : request(std::move(r)), buffers(std::move(b)) {}
  PyRequest(const PyRequest&) = delete;
  PyRequest& operator=(const PyRequest&) = delete;
  ~PyRequest() {
    if (request.valid() && !buffers.empty() && !request.done())
      keep_until_done(std::move(request), std::move(buffers));
  }

  Request request;
  std::vector<HeldBuffer> buffers;

  Status wait(const Seconds& timeout) {
    const auto t = to_timeout(timeout, "wait");
    py::gil_scoped_release release;
    return request.wait(t);
  }
  bool test() {
    py::gil_scoped_release release;
    return request.test();
  }
};

// The methods below, with buffers checked against the communicator's size.
class PyCommunicator {
 public:
  explicit PyCommunicator(Communicator comm) : comm_(std::move(comm)) {}

  Communicator& comm() { return comm_; }
  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }

  HeldBuffer in(const py::object& o, const std::optional<std::string>& dtype, const char* op,
                const char* arg = "the send buffer") {
    return hold(o, false, dtype, op, arg, rank());
  }
  HeldBuffer out(const py::object& o, const std::optional<std::string>& dtype, const char* op,
                 const char* arg = "the receive buffer") {
    return hold(o, true, dtype, op, arg, rank());
  }

  void expect_type(const HeldBuffer& b, DataType type, const char* op, const char* what) {
    if (b.type != type)
      usage_error(op, rank(),
                  std::string(what) + " holds " + std::string(name_of(b.type)) +
                      ", the send buffer " + std::string(name_of(type)));
  }

  void expect_count(const HeldBuffer& b, std::size_t count, DataType type, const char* op,
                    const char* what) {
    expect_type(b, type, op, what);
    if (b.count != count)
      usage_error(op, rank(),
                  std::string(what) + " holds " + std::to_string(b.count) + " elements; " +
                      std::to_string(count) + " are needed");
  }

  // Counts (one per rank) and displacements (one per rank, or none: packed in rank order)
  // must place every block inside `b`.
  void check_layout(const HeldBuffer& b, const Counts& counts, const Counts& displs, const char* op,
                    const char* what) {
    const auto ranks = static_cast<std::size_t>(size());
    if (counts.size() != ranks)
      usage_error(op, rank(),
                  std::to_string(counts.size()) + " counts for " + what + "; one per rank (" +
                      std::to_string(ranks) + ") is needed");
    if (!displs.empty() && displs.size() != ranks)
      usage_error(
          op, rank(),
          std::to_string(displs.size()) + " displacements for " + what + "; one per rank or none");
    std::size_t packed = 0;
    for (std::size_t r = 0; r < ranks; ++r) {
      const std::size_t first = displs.empty() ? packed : displs[r];
      packed += counts[r];
      if (first + counts[r] > b.count)
        usage_error(op, rank(),
                    std::string(what) + " holds " + std::to_string(b.count) + " elements; block " +
                        std::to_string(r) + " ends at " + std::to_string(first + counts[r]));
    }
  }

  std::size_t block_count(const HeldBuffer& b, const char* op, const char* what) {
    if (b.count % static_cast<std::size_t>(size()) != 0)
      usage_error(op, rank(),
                  std::string(what) + " holds " + std::to_string(b.count) +
                      " elements, not a multiple of the " + std::to_string(size()) + " ranks");
    return b.count / static_cast<std::size_t>(size());
  }

 private:
  Communicator comm_;
};

template <typename Fn>
auto released(Fn&& fn) {
  py::gil_scoped_release release;
  return fn();
}

// The buffers of one call, room made for a second (GCC 12 misreads growing a vector made from
// an initializer list as an out-of-bounds access).
std::vector<HeldBuffer> holding(HeldBuffer first) {
  std::vector<HeldBuffer> held;
  held.reserve(2);
  held.push_back(std::move(first));
  return held;
}

std::unique_ptr<PyRequest> make_request(Request r, std::vector<HeldBuffer> buffers) {
  return std::make_unique<PyRequest>(std::move(r), std::move(buffers));
}

void bind_types(py::module_& m) {
  py::class_<Status>(m, "Status", "What a completed request moved.")
      .def_readonly("source", &Status::source)
      .def_property_readonly("tag", [](const Status& s) { return to_underlying(s.tag); })
      .def_readonly("bytes", &Status::bytes)
      .def("__repr__", [](const Status& s) {
        return "Status(source=" + std::to_string(s.source) +
               ", tag=" + std::to_string(to_underlying(s.tag)) +
               ", bytes=" + std::to_string(s.bytes) + ")";
      });

  py::class_<PyRequest>(m, "Request", "A nonblocking operation; holds its buffers until done.")
      .def("wait", &PyRequest::wait, py::arg("timeout") = py::none(),
           "Waits (timeout in seconds; default ANVIEW_TIMEOUT) and returns the Status, or "
           "raises anview.Error.")
      .def("test", &PyRequest::test, "Drives progress once; True when complete.")
      .def_property_readonly("done", [](PyRequest& r) { return r.request.done(); })
      .def_property_readonly("status", [](PyRequest& r) { return r.request.status(); })
      .def("cancel", [](PyRequest& r) { return r.request.cancel(); });
}

void bind_store(py::module_& m) {
  auto options = [](const Seconds& timeout, int rank) {
    return StoreOptions{
        .timeout = to_timeout(timeout, "store.open").value_or(std::chrono::milliseconds(0)),
        .rank = rank};
  };
  py::class_<Store>(m, "Store", "The key-value store ranks find each other through.")
      .def_static(
          "serve_tcp",
          [options](const std::string& address, const Seconds& timeout, int rank) {
            return released([&] { return Store::serve_tcp(address, options(timeout, rank)); });
          },
          py::arg("address"), py::arg("timeout") = py::none(), py::arg("rank") = -1)
      .def_static(
          "connect_tcp",
          [options](const std::string& address, const Seconds& timeout, int rank) {
            return released([&] { return Store::connect_tcp(address, options(timeout, rank)); });
          },
          py::arg("address"), py::arg("timeout") = py::none(), py::arg("rank") = -1)
      .def_static(
          "file",
          [options](const std::string& directory, const Seconds& timeout, int rank) {
            return Store::file(directory, options(timeout, rank));
          },
          py::arg("directory"), py::arg("timeout") = py::none(), py::arg("rank") = -1)
      .def("set",
           [](Store& s, const std::string& key, const py::bytes& value) {
             std::string v = value;
             released([&] { s.set(key, v); });
           })
      .def("set", [](Store& s, const std::string& key,
                     const std::string& value) { released([&] { s.set(key, value); }); })
      .def(
          "get",
          [](Store& s, const std::string& key, const Seconds& timeout) {
            const auto t = to_timeout(timeout, "store.get");
            const Store::Bytes v = released([&] { return s.get(key, t); });
            return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
          },
          py::arg("key"), py::arg("timeout") = py::none())
      .def("add", [](Store& s, const std::string& key,
                     std::int64_t delta) { return released([&] { return s.add(key, delta); }); })
      .def("check",
           [](Store& s, const std::vector<std::string>& keys) {
             return released([&] { return s.check(keys); });
           })
      .def(
          "wait",
          [](Store& s, const std::vector<std::string>& keys, const Seconds& timeout) {
            const auto t = to_timeout(timeout, "store.wait");
            released([&] { s.wait(keys, t); });
          },
          py::arg("keys"), py::arg("timeout") = py::none())
      .def_property_readonly("address", &Store::address);
}

using OptStr = std::optional<std::string>;

void bind_p2p(py::class_<PyCommunicator>& c) {
  c.def(
       "isend",
       [](PyCommunicator& self, const py::object& buf, int peer, std::uint64_t tag) {
         HeldBuffer b = self.in(buf, std::nullopt, "isend");
         Request r = self.comm().isend(b.data(), b.bytes(), peer, Tag{tag});
         return make_request(std::move(r), {std::move(b)});
       },
       py::arg("buffer"), py::arg("peer"), py::arg("tag") = 0)
      .def(
          "irecv",
          [](PyCommunicator& self, const py::object& buf, int source, std::uint64_t tag) {
            HeldBuffer b = self.out(buf, std::nullopt, "irecv");
            Request r = self.comm().irecv(b.data(), b.bytes(), source, Tag{tag});
            return make_request(std::move(r), {std::move(b)});
          },
          py::arg("buffer"), py::arg("source") = any_source,
          py::arg("tag") = to_underlying(any_tag))
      .def(
          "send",
          [](PyCommunicator& self, const py::object& buf, int peer, std::uint64_t tag,
             const Seconds& timeout) {
            HeldBuffer b = self.in(buf, std::nullopt, "send");
            const auto t = to_timeout(timeout, "send");
            released([&] { self.comm().send(b.data(), b.bytes(), peer, Tag{tag}, t); });
          },
          py::arg("buffer"), py::arg("peer"), py::arg("tag") = 0, py::arg("timeout") = py::none())
      .def(
          "recv",
          [](PyCommunicator& self, const py::object& buf, int source, std::uint64_t tag,
             const Seconds& timeout) {
            HeldBuffer b = self.out(buf, std::nullopt, "recv");
            const auto t = to_timeout(timeout, "recv");
            return released(
                [&] { return self.comm().recv(b.data(), b.bytes(), source, Tag{tag}, t); });
          },
          py::arg("buffer"), py::arg("source") = any_source,
          py::arg("tag") = to_underlying(any_tag), py::arg("timeout") = py::none());
}

// The v-variants: per-rank counts and displacements (in elements; displacements default to
// the blocks packed in rank order), blocking and nonblocking.
void bind_vector_collectives(py::class_<PyCommunicator>& c) {
  for (const bool nb : {false, true})
    c.def(
        nb ? "iallgatherv" : "allgatherv",
        [nb](PyCommunicator& self, const py::object& buf, const py::object& out,
             const Counts& counts, const Counts& displs, const OptStr& dtype) {
          const char* name = nb ? "iallgatherv" : "allgatherv";
          HeldBuffer s = self.in(buf, dtype, name);
          HeldBuffer r = self.out(out, dtype, name, "out");
          self.expect_type(r, s.type, name, "out");
          self.check_layout(r, counts, displs, name, "out");
          if (counts[static_cast<std::size_t>(self.rank())] != s.count)
            usage_error(name, self.rank(),
                        "counts[rank] differs from the send buffer's " + std::to_string(s.count) +
                            " elements");
          if (nb)
            return make_request(
                self.comm().iallgatherv(s.data(), s.count, r.data(), counts, displs, s.type),
                {s, r});
          released(
              [&] { self.comm().allgatherv(s.data(), s.count, r.data(), counts, displs, s.type); });
          return std::unique_ptr<PyRequest>();
        },
        py::arg("buffer"), py::arg("out"), py::arg("counts"), py::arg("displs") = Counts{},
        py::arg("dtype") = py::none());

  for (const bool nb : {false, true})
    c.def(
        nb ? "igatherv" : "gatherv",
        [nb](PyCommunicator& self, const py::object& buf, const py::object& out,
             const Counts& counts, const Counts& displs, int root, const OptStr& dtype) {
          const char* name = nb ? "igatherv" : "gatherv";
          HeldBuffer s = self.in(buf, dtype, name);
          std::vector<HeldBuffer> held = holding(s);
          void* recv = nullptr;
          if (self.rank() == root) {
            if (out.is_none()) usage_error(name, self.rank(), "the root needs out=");
            HeldBuffer r = self.out(out, dtype, name, "out");
            self.expect_type(r, s.type, name, "out");
            self.check_layout(r, counts, displs, name, "out");
            recv = r.data();
            held.push_back(std::move(r));
          }
          if (nb)
            return make_request(
                self.comm().igatherv(s.data(), s.count, recv, counts, displs, s.type, root),
                std::move(held));
          released(
              [&] { self.comm().gatherv(s.data(), s.count, recv, counts, displs, s.type, root); });
          return std::unique_ptr<PyRequest>();
        },
        py::arg("buffer"), py::arg("out") = py::none(), py::arg("counts") = Counts{},
        py::arg("displs") = Counts{}, py::arg("root") = 0, py::arg("dtype") = py::none());

  for (const bool nb : {false, true})
    c.def(
        nb ? "iscatterv" : "scatterv",
        [nb](PyCommunicator& self, const py::object& buf, const Counts& counts,
             const py::object& out, const Counts& displs, int root, const OptStr& dtype) {
          const char* name = nb ? "iscatterv" : "scatterv";
          HeldBuffer r = self.out(out, dtype, name, "out");
          std::vector<HeldBuffer> held = holding(r);
          const void* send = nullptr;
          if (self.rank() == root) {
            HeldBuffer s = self.in(buf, dtype, name);
            self.expect_type(s, r.type, name, "the send buffer");
            self.check_layout(s, counts, displs, name, "the send buffer");
            send = s.data();
            held.push_back(std::move(s));
          }
          if (nb)
            return make_request(
                self.comm().iscatterv(send, counts, displs, r.data(), r.count, r.type, root),
                std::move(held));
          released(
              [&] { self.comm().scatterv(send, counts, displs, r.data(), r.count, r.type, root); });
          return std::unique_ptr<PyRequest>();
        },
        py::arg("buffer"), py::arg("counts"), py::arg("out"), py::arg("displs") = Counts{},
        py::arg("root") = 0, py::arg("dtype") = py::none());

  for (const bool nb : {false, true})
    c.def(
        nb ? "ialltoallv" : "alltoallv",
        [nb](PyCommunicator& self, const py::object& buf, const Counts& send_counts,
             const py::object& out, const Counts& recv_counts, const Counts& send_displs,
             const Counts& recv_displs, const OptStr& dtype) {
          const char* name = nb ? "ialltoallv" : "alltoallv";
          HeldBuffer s = self.in(buf, dtype, name);
          HeldBuffer r = self.out(out, dtype, name, "out");
          self.expect_type(r, s.type, name, "out");
          self.check_layout(s, send_counts, send_displs, name, "the send buffer");
          self.check_layout(r, recv_counts, recv_displs, name, "out");
          if (nb)
            return make_request(self.comm().ialltoallv(s.data(), send_counts, send_displs, r.data(),
                                                       recv_counts, recv_displs, s.type),
                                {s, r});
          released([&] {
            self.comm().alltoallv(s.data(), send_counts, send_displs, r.data(), recv_counts,
                                  recv_displs, s.type);
          });
          return std::unique_ptr<PyRequest>();
        },
        py::arg("buffer"), py::arg("send_counts"), py::arg("out"), py::arg("recv_counts"),
        py::arg("send_displs") = Counts{}, py::arg("recv_displs") = Counts{},
        py::arg("dtype") = py::none());
}

// Each collective is bound twice: blocking (name) and nonblocking (i + name, a Request).
void bind_collectives(py::class_<PyCommunicator>& c) {
  // allreduce(buffer, op="sum", out=None, dtype=None): in place unless out is given.
  auto allreduce = [](PyCommunicator& self, const py::object& buf, const std::string& op,
                      const py::object& out, const OptStr& dtype, bool nonblocking) {
    const char* name = nonblocking ? "iallreduce" : "allreduce";
    HeldBuffer s =
        out.is_none() ? self.out(buf, dtype, name, "the buffer") : self.in(buf, dtype, name);
    const ReduceOp rop = parse_op(op, name, self.rank());
    std::vector<HeldBuffer> held = holding(s);
    void* recv = s.data();
    if (!out.is_none()) {
      HeldBuffer r = self.out(out, dtype, name, "out");
      self.expect_count(r, s.count, s.type, name, "out");
      recv = r.data();
      held.push_back(std::move(r));
    }
    if (nonblocking)
      return make_request(self.comm().iallreduce(s.data(), recv, s.count, s.type, rop),
                          std::move(held));
    released([&] { self.comm().allreduce(s.data(), recv, s.count, s.type, rop); });
    return std::unique_ptr<PyRequest>();
  };
  for (const bool nb : {false, true})
    c.def(
        nb ? "iallreduce" : "allreduce",
        [allreduce, nb](PyCommunicator& self, const py::object& buf, const std::string& op,
                        const py::object& out,
                        const OptStr& dtype) { return allreduce(self, buf, op, out, dtype, nb); },
        py::arg("buffer"), py::arg("op") = "sum", py::arg("out") = py::none(),
        py::arg("dtype") = py::none());

  for (const bool nb : {false, true})
    c.def(
        nb ? "ibroadcast" : "broadcast",
        [nb](PyCommunicator& self, const py::object& buf, int root, const OptStr& dtype) {
          const char* name = nb ? "ibroadcast" : "broadcast";
          HeldBuffer b = self.out(buf, dtype, name, "the buffer");
          if (nb) return make_request(self.comm().ibroadcast(b.data(), b.count, b.type, root), {b});
          released([&] { self.comm().broadcast(b.data(), b.count, b.type, root); });
          return std::unique_ptr<PyRequest>();
        },
        py::arg("buffer"), py::arg("root") = 0, py::arg("dtype") = py::none());

  // reduce(buffer, root=0, op="sum", out=None): the result lands in out (or in place) on root.
  for (const bool nb : {false, true})
    c.def(
        nb ? "ireduce" : "reduce",
        [nb](PyCommunicator& self, const py::object& buf, int root, const std::string& op,
             const py::object& out, const OptStr& dtype) {
          const char* name = nb ? "ireduce" : "reduce";
          const bool in_place = out.is_none() || self.rank() != root;
          HeldBuffer s = in_place && self.rank() == root ? self.out(buf, dtype, name, "the buffer")
                                                         : self.in(buf, dtype, name);
          const ReduceOp rop = parse_op(op, name, self.rank());
          std::vector<HeldBuffer> held = holding(s);
          void* recv = s.data();
          if (!in_place) {
            HeldBuffer r = self.out(out, dtype, name, "out");
            self.expect_count(r, s.count, s.type, name, "out");
            recv = r.data();
            held.push_back(std::move(r));
          }
          if (nb)
            return make_request(self.comm().ireduce(s.data(), recv, s.count, s.type, rop, root),
                                std::move(held));
          released([&] { self.comm().reduce(s.data(), recv, s.count, s.type, rop, root); });
          return std::unique_ptr<PyRequest>();
        },
        py::arg("buffer"), py::arg("root") = 0, py::arg("op") = "sum", py::arg("out") = py::none(),
        py::arg("dtype") = py::none());

  // allgather(buffer, out): out holds size() blocks of len(buffer).
  for (const bool nb : {false, true})
    c.def(
        nb ? "iallgather" : "allgather",
        [nb](PyCommunicator& self, const py::object& buf, const py::object& out,
             const OptStr& dtype) {
          const char* name = nb ? "iallgather" : "allgather";
          HeldBuffer s = self.in(buf, dtype, name);
          HeldBuffer r = self.out(out, dtype, name, "out");
          self.expect_count(r, s.count * static_cast<std::size_t>(self.size()), s.type, name,
                            "out");
          if (nb)
            return make_request(self.comm().iallgather(s.data(), r.data(), s.count, s.type),
                                {s, r});
          released([&] { self.comm().allgather(s.data(), r.data(), s.count, s.type); });
          return std::unique_ptr<PyRequest>();
        },
        py::arg("buffer"), py::arg("out"), py::arg("dtype") = py::none());

  // reduce_scatter(buffer, out, op): buffer holds size() blocks of len(out).
  for (const bool nb : {false, true})
    c.def(
        nb ? "ireduce_scatter" : "reduce_scatter",
        [nb](PyCommunicator& self, const py::object& buf, const py::object& out,
             const std::string& op, const OptStr& dtype) {
          const char* name = nb ? "ireduce_scatter" : "reduce_scatter";
          HeldBuffer s = self.in(buf, dtype, name);
          const std::size_t block = self.block_count(s, name, "the send buffer");
          HeldBuffer r = self.out(out, dtype, name, "out");
          self.expect_count(r, block, s.type, name, "out");
          const ReduceOp rop = parse_op(op, name, self.rank());
          if (nb)
            return make_request(self.comm().ireduce_scatter(s.data(), r.data(), block, s.type, rop),
                                {s, r});
          released([&] { self.comm().reduce_scatter(s.data(), r.data(), block, s.type, rop); });
          return std::unique_ptr<PyRequest>();
        },
        py::arg("buffer"), py::arg("out"), py::arg("op") = "sum", py::arg("dtype") = py::none());

  // alltoall(buffer, out): both hold size() blocks.
  for (const bool nb : {false, true})
    c.def(
        nb ? "ialltoall" : "alltoall",
        [nb](PyCommunicator& self, const py::object& buf, const py::object& out,
             const OptStr& dtype) {
          const char* name = nb ? "ialltoall" : "alltoall";
          HeldBuffer s = self.in(buf, dtype, name);
          const std::size_t block = self.block_count(s, name, "the send buffer");
          HeldBuffer r = self.out(out, dtype, name, "out");
          self.expect_count(r, s.count, s.type, name, "out");
          if (nb)
            return make_request(self.comm().ialltoall(s.data(), r.data(), block, s.type), {s, r});
          released([&] { self.comm().alltoall(s.data(), r.data(), block, s.type); });
          return std::unique_ptr<PyRequest>();
        },
        py::arg("buffer"), py::arg("out"), py::arg("dtype") = py::none());

  // gather(buffer, out=None, root=0): out (root only) holds size() blocks.
  c.def(
      "gather",
      [](PyCommunicator& self, const py::object& buf, const py::object& out, int root,
         const OptStr& dtype) {
        HeldBuffer s = self.in(buf, dtype, "gather");
        std::optional<HeldBuffer> r;
        if (self.rank() == root) {
          if (out.is_none()) usage_error("gather", self.rank(), "the root needs out=");
          r = self.out(out, dtype, "gather", "out");
          self.expect_count(*r, s.count * static_cast<std::size_t>(self.size()), s.type, "gather",
                            "out");
        }
        released(
            [&] { self.comm().gather(s.data(), r ? r->data() : nullptr, s.count, s.type, root); });
      },
      py::arg("buffer"), py::arg("out") = py::none(), py::arg("root") = 0,
      py::arg("dtype") = py::none());

  // scatter(buffer, out, root=0): buffer (root only; None elsewhere) holds size() blocks.
  c.def(
      "scatter",
      [](PyCommunicator& self, const py::object& buf, const py::object& out, int root,
         const OptStr& dtype) {
        HeldBuffer r = self.out(out, dtype, "scatter", "out");
        std::optional<HeldBuffer> s;
        if (self.rank() == root) {
          s = self.in(buf, dtype, "scatter");
          self.expect_count(*s, r.count * static_cast<std::size_t>(self.size()), r.type, "scatter",
                            "the send buffer");
        }
        released(
            [&] { self.comm().scatter(s ? s->data() : nullptr, r.data(), r.count, r.type, root); });
      },
      py::arg("buffer"), py::arg("out"), py::arg("root") = 0, py::arg("dtype") = py::none());

  bind_vector_collectives(c);

  c.def("barrier", [](PyCommunicator& self) {
     released([&] { self.comm().barrier(); });
   }).def("ibarrier", [](PyCommunicator& self) {
    return make_request(self.comm().ibarrier(), {});
  });
}

void bind_host_buffer(py::module_& m) {
  py::class_<HostBuffer>(m, "HostBuffer", py::buffer_protocol(),
                         "Zeroed memory in 2 MiB pages where the kernel allows (see "
                         "anview/host_buffer.hpp): large same-host messages move about twice as "
                         "fast when the sender's and the receiver's buffers are both such "
                         "memory. View it with numpy.frombuffer(buf, dtype) or "
                         "torch.frombuffer(buf, dtype=...); it lives as long as a view does.")
      .def(py::init<std::size_t>(), py::arg("nbytes"))
      .def_property_readonly("nbytes", &HostBuffer::size)
      .def_property_readonly("huge_pages", &HostBuffer::huge_pages,
                             "The kernel was asked for 2 MiB pages and its policy allows them.")
      .def("__len__", &HostBuffer::size)
      .def_static("huge_page_policy", &HostBuffer::huge_page_policy,
                  "always, madvise, never or unavailable: the kernel's transparent huge pages.")
      .def_buffer([](HostBuffer& buffer) {
        // An empty buffer has no memory: a view of it needs an address all the same.
        static unsigned char nothing = 0;
        void* data = buffer.empty() ? &nothing : buffer.data();
        return py::buffer_info(data, 1, py::format_descriptor<unsigned char>::format(), 1,
                               {buffer.size()}, {1});
      });
}

void bind_communicator(py::module_& m) {
  py::class_<PyCommunicator> c(m, "Communicator",
                               "A group of ranks exchanging tagged messages and running "
                               "collectives (see anview/communicator.hpp).");
  c.def_static(
       "from_env",
       [](const Seconds& timeout) {
         const CommunicatorOptions options{
             .timeout = to_timeout(timeout, "from_env").value_or(std::chrono::milliseconds(0))};
         return released([&] { return PyCommunicator(Communicator::from_env(options)); });
       },
       py::arg("timeout") = py::none(),
       "Rank, size and store from the launcher's environment (anview-run, torchrun, mpirun, srun).")
      .def_static(
          "create",
          [](int rank, int size, const Store& store, const Seconds& timeout,
             const std::string& prefix) {
            const CommunicatorOptions options{
                .timeout = to_timeout(timeout, "create").value_or(std::chrono::milliseconds(0)),
                .store_prefix = prefix};
            return released(
                [&] { return PyCommunicator(Communicator::create(rank, size, store, options)); });
          },
          py::arg("rank"), py::arg("size"), py::arg("store"), py::arg("timeout") = py::none(),
          py::arg("store_prefix") = "anview")
      .def_property_readonly("rank", &PyCommunicator::rank)
      .def_property_readonly("size", &PyCommunicator::size)
      .def(
          "split",
          [](PyCommunicator& self, int color, int key) {
            return released([&] { return PyCommunicator(self.comm().split(color, key)); });
          },
          py::arg("color"), py::arg("key") = 0)
      .def("transport_name",
           [](PyCommunicator& self, int peer) { return self.comm().transport_name(peer); })
      .def("describe_peer",
           [](PyCommunicator& self, int peer) { return self.comm().describe_peer(peer); })
      .def(
          "collective_algorithm",
          [](PyCommunicator& self, const std::string& collective, std::size_t bytes) {
            std::string why;
            std::string algorithm = self.comm().collective_algorithm(collective, bytes, &why);
            return py::make_tuple(algorithm, why);
          },
          py::arg("collective"), py::arg("bytes"),
          "(algorithm, why) for `bytes` of `collective` on this communicator.")
      .def(
          "explain_collective",
          [](PyCommunicator& self, const std::string& collective, std::size_t bytes) {
            return released([&] { return self.comm().explain_collective(collective, bytes); });
          },
          py::arg("collective"), py::arg("bytes"))
      .def(
          "dump_state", [](PyCommunicator& self) { return self.comm().dump_state(); },
          "This communicator's flight recorder, pending requests and peers, as JSON text.");
  bind_p2p(c);
  bind_collectives(c);
}

void bind_error(py::module_& m) {
  // Kept for the life of the process (never decref'd at exit, after the interpreter is gone).
  static PyObject* error_type = PyErr_NewExceptionWithDoc(
      "anview.Error",
      "An Anview failure: kind (usage, timeout, peer_lost, link, protocol, internal, auth), rank, "
      "peer, operation and cause.",
      PyExc_RuntimeError, nullptr);
  if (error_type == nullptr) throw py::error_already_set();
  m.attr("Error") = py::handle(error_type);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      py::object instance = py::handle(error_type)(e.what());
      instance.attr("kind") = to_string(e.kind());
      instance.attr("rank") = e.rank();
      instance.attr("peer") = e.peer();
      instance.attr("operation") = e.operation();
      instance.attr("cause") = e.cause();
      PyErr_SetObject(error_type, instance.ptr());
    }
  });
}

}  // namespace
}  // namespace anview::python

PYBIND11_MODULE(_anview, m) {
  using namespace anview::python;
  m.doc() = "Anview: point-to-point messaging and collectives over shared memory and TCP.";
  m.attr("__version__") = ANVIEW_VERSION;
  m.attr("ANY_SOURCE") = anview::any_source;
  m.attr("ANY_TAG") = anview::to_underlying(anview::any_tag);
  bind_error(m);
  bind_types(m);
  bind_store(m);
  bind_host_buffer(m);
  bind_communicator(m);
  m.def("metrics_prometheus", &anview::metrics_prometheus,
        "The process's metrics in the Prometheus text format.");
  m.def("metrics_json", &anview::metrics_json, "The process's metrics as JSON text.");
}
