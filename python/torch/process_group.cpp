#include "process_group.hpp"

#include <numeric>
#include <string>
#include <utility>

#include "c10d_store.hpp"
#include "tensors.hpp"

namespace anview::torch_backend {
namespace {

using c10d::OpType;

std::chrono::milliseconds option_timeout(std::chrono::milliseconds t) {
  return t == c10d::kUnsetTimeout ? std::chrono::milliseconds(0) : t;
}

// A contiguous stand-in for `t` (itself when contiguous), written back into it after the
// operation when it had to be a copy.
struct Staged {
  at::Tensor original;
  at::Tensor buffer;
  explicit Staged(const at::Tensor& t) : original(t), buffer(t.contiguous()) {}
  void write_back() const {
    if (!buffer.is_same(original)) original.copy_(buffer);
  }
  void* data() const { return buffer.data_ptr(); }
};

std::vector<std::size_t> equal_counts(int ranks, std::size_t count) {
  return std::vector<std::size_t>(static_cast<std::size_t>(ranks), count);
}

// Element counts per rank of an all_to_all_single side: its splits (rows of dim 0) times the
// elements per row, or equal blocks when no splits are given.
std::vector<std::size_t> split_counts(const at::Tensor& t, const std::vector<int64_t>& splits,
                                      int ranks, const char* side, int rank) {
  const auto numel = count_of(t);
  if (splits.empty()) {
    if (numel % static_cast<std::size_t>(ranks) != 0)
      refuse("all_to_all_single", rank,
             std::string("the ") + side + " tensor has " + std::to_string(numel) +
                 " elements, not a multiple of the " + std::to_string(ranks) + " ranks");
    return equal_counts(ranks, numel / static_cast<std::size_t>(ranks));
  }
  if (splits.size() != static_cast<std::size_t>(ranks))
    refuse("all_to_all_single", rank,
           std::to_string(splits.size()) + " " + side + " splits for " + std::to_string(ranks) +
               " ranks");
  const std::size_t rows = t.dim() == 0 ? 1 : static_cast<std::size_t>(t.size(0));
  const std::size_t row = rows == 0 ? 0 : numel / rows;
  std::vector<std::size_t> counts;
  std::size_t total_rows = 0;
  for (int64_t s : splits) {
    if (s < 0) refuse("all_to_all_single", rank, std::string("a negative ") + side + " split");
    counts.push_back(static_cast<std::size_t>(s) * row);
    total_rows += static_cast<std::size_t>(s);
  }
  if (total_rows != rows)
    refuse("all_to_all_single", rank,
           std::string("the ") + side + " splits add up to " + std::to_string(total_rows) +
               " rows; the tensor has " + std::to_string(rows));
  return counts;
}

std::vector<std::size_t> displacements(const std::vector<std::size_t>& counts) {
  std::vector<std::size_t> displs(counts.size(), 0);
  std::exclusive_scan(counts.begin(), counts.end(), displs.begin(), std::size_t{0});
  return displs;
}

}  // namespace

c10::intrusive_ptr<c10d::ProcessGroup> ProcessGroupAnview::create(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout) {
  Store wrapped =
      Store::wrap(std::make_shared<C10dStore>(store), {.timeout = timeout, .rank = rank});
  Communicator comm = Communicator::create(rank, size, std::move(wrapped), {.timeout = timeout});
  return c10::make_intrusive<ProcessGroupAnview>(std::move(comm), timeout);
}

ProcessGroupAnview::ProcessGroupAnview(Communicator comm, std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(comm.rank(), comm.size()), comm_(std::move(comm)), timeout_(timeout) {}

ProcessGroupAnview::~ProcessGroupAnview() {
  retired_->release();
}

ProcessGroupAnview::WorkPtr ProcessGroupAnview::launch(Launch l,
                                                       const std::function<Request()>& start,
                                                       AnviewWork::Finish finish) {
  retired_->release();
  const auto timeout = l.timeout.count() > 0 ? l.timeout : timeout_;
  auto work = c10::make_intrusive<AnviewWork>(getRank(), l.type, l.title, std::move(l.outputs),
                                              std::move(l.held), timeout);
  if (!l.point_to_point) ++sequence_;
  work->start(start(), std::move(finish), retired_, l.point_to_point ? helper_ : nullptr);
  return work;
}

ProcessGroupAnview::WorkPtr ProcessGroupAnview::allreduce(Tensors& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  const at::Tensor& t = single(tensors, "all_reduce", getRank());
  const DataType type = element_type(t, "all_reduce", getRank());
  const ReduceOp op = reduce_op(opts.reduceOp, t, "all_reduce", getRank());
  Staged s(t);
  return launch(
      {OpType::ALLREDUCE, "anview:all_reduce", option_timeout(opts.timeout), {t}, {s.buffer}},
      [&] { return comm_.iallreduce(s.data(), count_of(t), type, op); },
      [s](const Status&) { s.write_back(); });
}

ProcessGroupAnview::WorkPtr ProcessGroupAnview::allreduce_coalesced(
    Tensors& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  if (tensors.empty()) refuse("all_reduce_coalesced", getRank(), "no tensors");
  check_cpu_dense(tensors[0], "all_reduce_coalesced", getRank());
  for (const auto& t : tensors) {
    check_cpu_dense(t, "all_reduce_coalesced", getRank());
    if (t.scalar_type() != tensors[0].scalar_type())
      refuse("all_reduce_coalesced", getRank(), "tensors of different types");
  }
  const DataType type = element_type(tensors[0], "all_reduce_coalesced", getRank());
  const ReduceOp op = reduce_op(opts.reduceOp, tensors[0], "all_reduce_coalesced", getRank());
  at::Tensor flat = flatten(tensors);
  return launch(
      {OpType::ALLREDUCE_COALESCED,
       "anview:all_reduce_coalesced",
       option_timeout(opts.timeout),
       tensors,
       {flat}},
      [&] { return comm_.iallreduce(flat.data_ptr(), count_of(flat), type, op); },
      [flat, tensors](const Status&) { unflatten(flat, tensors); });
}

ProcessGroupAnview::WorkPtr ProcessGroupAnview::broadcast(Tensors& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  const at::Tensor& t = single(tensors, "broadcast", getRank());
  const DataType type = element_type(t, "broadcast", getRank());
  Staged s(t);
  const int root = static_cast<int>(opts.rootRank);
  return launch(
      {OpType::BROADCAST, "anview:broadcast", option_timeout(opts.timeout), {t}, {s.buffer}},
      [&] { return comm_.ibroadcast(s.data(), count_of(t), type, root); },
      [s](const Status&) { s.write_back(); });
}

ProcessGroupAnview::WorkPtr ProcessGroupAnview::reduce(Tensors& tensors,
                                                       const c10d::ReduceOptions& opts) {
  const at::Tensor& t = single(tensors, "reduce", getRank());
  const DataType type = element_type(t, "reduce", getRank());
  const ReduceOp op = reduce_op(opts.reduceOp, t, "reduce", getRank());
  Staged s(t);
  const int root = static_cast<int>(opts.rootRank);
  const bool is_root = root == getRank();
  return launch(
      {OpType::REDUCE, "anview:reduce", option_timeout(opts.timeout), {t}, {s.buffer}},
      [&] { return comm_.ireduce(s.data(), s.data(), count_of(t), type, op, root); },
      [s, is_root](const Status&) {
        if (is_root) s.write_back();
      });
}

ProcessGroupAnview::WorkPtr ProcessGroupAnview::allgather(std::vector<Tensors>& outputs,
                                                          Tensors& inputs,
                                                          const c10d::AllgatherOptions& opts) {
  const at::Tensor& in = single(inputs, "all_gather", getRank());
  if (outputs.size() != 1 || outputs[0].size() != static_cast<std::size_t>(getSize()))
    refuse("all_gather", getRank(), "the output list must hold one tensor per rank");
  check_same(outputs[0], in, "all_gather", getRank());
  const DataType type = element_type(in, "all_gather", getRank());
  at::Tensor send = in.contiguous();
  at::Tensor flat = at::empty({in.numel() * getSize()}, in.options());
  Tensors outs = outputs[0];
  return launch(
      {OpType::ALLGATHER, "anview:all_gather", option_timeout(opts.timeout), outs, {send, flat}},
      [&] { return comm_.iallgather(send.data_ptr(), flat.data_ptr(), count_of(in), type); },
      [flat, outs](const Status&) { unflatten(flat, outs); });
}

ProcessGroupAnview::WorkPtr ProcessGroupAnview::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  check_cpu_dense(input, "all_gather_into_tensor", getRank());
  check_cpu_dense(output, "all_gather_into_tensor", getRank());
  const DataType type = element_type(input, "all_gather_into_tensor", getRank());
  if (output.scalar_type() != input.scalar_type() || output.numel() != input.numel() * getSize())
    refuse("all_gather_into_tensor", getRank(),
           "the output must hold " + std::to_string(getSize()) + " times the input's " +
               std::to_string(input.numel()) + " elements of its type; it holds " +
               std::to_string(output.numel()));
  at::Tensor send = input.contiguous();
  Staged out(output);
  return launch(
      {OpType::_ALLGATHER_BASE,
       "anview:all_gather_into_tensor",
       option_timeout(opts.timeout),
       {output},
       {send, out.buffer}},
      [&] { return comm_.iallgather(send.data_ptr(), out.data(), count_of(input), type); },
      [out](const Status&) { out.write_back(); });
}

ProcessGroupAnview::WorkPtr ProcessGroupAnview::allgather_coalesced(
    std::vector<Tensors>& output_lists, Tensors& inputs, const c10d::AllgatherOptions& opts) {
  if (inputs.empty()) refuse("all_gather_coalesced", getRank(), "no input tensors");
  if (output_lists.size() != static_cast<std::size_t>(getSize()))
    refuse("all_gather_coalesced", getRank(), "the output must hold one list per rank");
  for (const auto& list : output_lists) {
    if (list.size() != inputs.size())
      refuse("all_gather_coalesced", getRank(), "every output list must match the input list");
    for (std::size_t i = 0; i < inputs.size(); ++i)
      check_same({list[i]}, inputs[i], "all_gather_coalesced", getRank());
  }
  for (const auto& t : inputs)
    if (t.scalar_type() != inputs[0].scalar_type())
      refuse("all_gather_coalesced", getRank(), "input tensors of different types");
  const DataType type = element_type(inputs[0], "all_gather_coalesced", getRank());
  at::Tensor send = flatten(inputs);
  at::Tensor flat = at::empty({send.numel() * getSize()}, send.options());
  Tensors outs;
  for (const auto& list : output_lists) outs.insert(outs.end(), list.begin(), list.end());
  return launch(
      {OpType::ALLGATHER_COALESCED,
       "anview:all_gather_coalesced",
       option_timeout(opts.timeout),
       outs,
       {send, flat}},
      [&] { return comm_.iallgather(send.data_ptr(), flat.data_ptr(), count_of(send), type); },
      [flat, outs](const Status&) { unflatten(flat, outs); });
}

ProcessGroupAnview::WorkPtr ProcessGroupAnview::gather(std::vector<Tensors>& outputs,
                                                       Tensors& inputs,
                                                       const c10d::GatherOptions& opts) {
  const at::Tensor& in = single(inputs, "gather", getRank());
  const DataType type = element_type(in, "gather", getRank());
  const int root = static_cast<int>(opts.rootRank);
  Tensors outs;
  if (getRank() == root) {
    if (outputs.size() != 1 || outputs[0].size() != static_cast<std::size_t>(getSize()))
      refuse("gather", getRank(), "the root's output list must hold one tensor per rank");
    check_same(outputs[0], in, "gather", getRank());
    outs = outputs[0];
  } else if (!outputs.empty() && !outputs[0].empty()) {
    refuse("gather", getRank(), "only the root passes output tensors");
  }
  at::Tensor send = in.contiguous();
  at::Tensor flat = at::empty({getRank() == root ? in.numel() * getSize() : 0}, in.options());
  const auto counts = equal_counts(getSize(), count_of(in));
  return launch(
      {OpType::GATHER, "anview:gather", option_timeout(opts.timeout), outs, {send, flat}},
      [&] {
        return comm_.igatherv(send.data_ptr(), count_of(in), flat.data_ptr(), counts, {}, type,
                              root);
      },
      [flat, outs](const Status&) {
        if (!outs.empty()) unflatten(flat, outs);
      });
}

ProcessGroupAnview::WorkPtr ProcessGroupAnview::scatter(Tensors& outputs,
                                                        std::vector<Tensors>& inputs,
                                                        const c10d::ScatterOptions& opts) {
  const at::Tensor& out = single(outputs, "scatter", getRank());
  const DataType type = element_type(out, "scatter", getRank());
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor flat = at::empty({0}, out.options());
  if (getRank() == root) {
    if (inputs.size() != 1 || inputs[0].size() != static_cast<std::size_t>(getSize()))
      refuse("scatter", getRank(), "the root's input list must hold one tensor per rank");
    check_same(inputs[0], out, "scatter", getRank());
    flat = flatten(inputs[0]);
  } else if (!inputs.empty() && !inputs[0].empty()) {
    refuse("scatter", getRank(), "only the root passes input tensors");
  }
  Staged recv(out);
  const auto counts = equal_counts(getSize(), count_of(out));
  return launch(
      {OpType::SCATTER, "anview:scatter", option_timeout(opts.timeout), {out}, {flat, recv.buffer}},
      [&] {
        return comm_.iscatterv(flat.data_ptr(), counts, {}, recv.data(), count_of(out), type, root);
      },
      [recv](const Status&) { recv.write_back(); });
}

ProcessGroupAnview::WorkPtr ProcessGroupAnview::reduce_scatter(
    Tensors& outputs, std::vector<Tensors>& inputs, const c10d::ReduceScatterOptions& opts) {
  const at::Tensor& out = single(outputs, "reduce_scatter", getRank());
  if (inputs.size() != 1 || inputs[0].size() != static_cast<std::size_t>(getSize()))
    refuse("reduce_scatter", getRank(), "the input list must hold one tensor per rank");
  check_same(inputs[0], out, "reduce_scatter", getRank());
  const DataType type = element_type(out, "reduce_scatter", getRank());
  const ReduceOp op = reduce_op(opts.reduceOp, out, "reduce_scatter", getRank());
  at::Tensor flat = flatten(inputs[0]);
  Staged recv(out);
  return launch(
      {OpType::REDUCE_SCATTER,
       "anview:reduce_scatter",
       option_timeout(opts.timeout),
       {out},
       {flat, recv.buffer}},
      [&] { return comm_.ireduce_scatter(flat.data_ptr(), recv.data(), count_of(out), type, op); },
      [recv](const Status&) { recv.write_back(); });
}

ProcessGroupAnview::WorkPtr ProcessGroupAnview::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  check_cpu_dense(input, "reduce_scatter_tensor", getRank());
  check_cpu_dense(output, "reduce_scatter_tensor", getRank());
  if (output.scalar_type() != input.scalar_type() || input.numel() != output.numel() * getSize())
    refuse("reduce_scatter_tensor", getRank(),
           "the input must hold " + std::to_string(getSize()) + " times the output's " +
               std::to_string(output.numel()) + " elements of its type; it holds " +
               std::to_string(input.numel()));
  const DataType type = element_type(output, "reduce_scatter_tensor", getRank());
  const ReduceOp op = reduce_op(opts.reduceOp, output, "reduce_scatter_tensor", getRank());
  at::Tensor send = input.contiguous();
  Staged recv(output);
  return launch(
      {OpType::_REDUCE_SCATTER_BASE,
       "anview:reduce_scatter_tensor",
       option_timeout(opts.timeout),
       {output},
       {send, recv.buffer}},
      [&] {
        return comm_.ireduce_scatter(send.data_ptr(), recv.data(), count_of(output), type, op);
      },
      [recv](const Status&) { recv.write_back(); });
}

ProcessGroupAnview::WorkPtr ProcessGroupAnview::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_splits,
                                                              std::vector<int64_t>& input_splits,
                                                              const c10d::AllToAllOptions& opts) {
  check_cpu_dense(input, "all_to_all_single", getRank());
  check_cpu_dense(output, "all_to_all_single", getRank());
  if (output.scalar_type() != input.scalar_type())
    refuse("all_to_all_single", getRank(), "the input and output types differ");
  const DataType type = element_type(input, "all_to_all_single", getRank());
  const auto send_counts = split_counts(input, input_splits, getSize(), "input", getRank());
  const auto recv_counts = split_counts(output, output_splits, getSize(), "output", getRank());
  at::Tensor send = input.contiguous();
  Staged recv(output);
  return launch(
      {OpType::ALLTOALL_BASE,
       "anview:all_to_all_single",
       option_timeout(opts.timeout),
       {output},
       {send, recv.buffer}},
      [&] {
        return comm_.ialltoallv(send.data_ptr(), send_counts, displacements(send_counts),
                                recv.data(), recv_counts, displacements(recv_counts), type);
      },
      [recv](const Status&) { recv.write_back(); });
}

ProcessGroupAnview::WorkPtr ProcessGroupAnview::alltoall(Tensors& outputs, Tensors& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  if (outputs.size() != static_cast<std::size_t>(getSize()) ||
      inputs.size() != static_cast<std::size_t>(getSize()))
    refuse("all_to_all", getRank(), "the input and output lists must hold one tensor per rank");
  for (const auto& t : inputs) check_cpu_dense(t, "all_to_all", getRank());
  for (const auto& t : outputs) check_cpu_dense(t, "all_to_all", getRank());
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].scalar_type() != inputs[0].scalar_type() ||
        outputs[i].scalar_type() != inputs[0].scalar_type())
      refuse("all_to_all", getRank(), "tensors of different types");
  const DataType type = element_type(inputs[0], "all_to_all", getRank());
  std::vector<std::size_t> send_counts, recv_counts;
  for (const auto& t : inputs) send_counts.push_back(count_of(t));
  for (const auto& t : outputs) recv_counts.push_back(count_of(t));
  at::Tensor send = flatten(inputs);
  at::Tensor flat = at::empty({static_cast<int64_t>(std::accumulate(
                                  recv_counts.begin(), recv_counts.end(), std::size_t{0}))},
                              inputs[0].options());
  Tensors outs = outputs;
  return launch(
      {OpType::ALLTOALL, "anview:all_to_all", option_timeout(opts.timeout), outs, {send, flat}},
      [&] {
        return comm_.ialltoallv(send.data_ptr(), send_counts, displacements(send_counts),
                                flat.data_ptr(), recv_counts, displacements(recv_counts), type);
      },
      [flat, outs](const Status&) { unflatten(flat, outs); });
}

ProcessGroupAnview::WorkPtr ProcessGroupAnview::barrier(const c10d::BarrierOptions& opts) {
  return launch({OpType::BARRIER, "anview:barrier", option_timeout(opts.timeout), {}, {}},
                [&] { return comm_.ibarrier(); });
}

ProcessGroupAnview::WorkPtr ProcessGroupAnview::send(Tensors& tensors, int dst, int tag) {
  const at::Tensor& t = single(tensors, "send", getRank());
  if (tag < 0) refuse("send", getRank(), "negative tag " + std::to_string(tag));
  at::Tensor buffer = t.contiguous();
  const std::size_t bytes = buffer.nbytes();
  return launch({OpType::SEND, "anview:send", {}, {t}, {buffer}, /*point_to_point=*/true}, [&] {
    return comm_.isend(buffer.data_ptr(), bytes, dst, Tag{static_cast<std::uint64_t>(tag)});
  });
}

ProcessGroupAnview::WorkPtr ProcessGroupAnview::receive(Tensors& tensors, int source, int tag,
                                                        OpType type, const char* title) {
  const at::Tensor& t = single(tensors, title, getRank());
  if (tag < 0) refuse(title, getRank(), "negative tag " + std::to_string(tag));
  Staged recv(t);
  const std::size_t bytes = recv.buffer.nbytes();
  const int rank = getRank();
  return launch(
      {type, title, {}, {t}, {recv.buffer}, /*point_to_point=*/true},
      [&] { return comm_.irecv(recv.data(), bytes, source, Tag{static_cast<std::uint64_t>(tag)}); },
      [recv, bytes, rank, title](const Status& status) {
        if (status.bytes != bytes)
          throw Error(
              ErrorKind::usage,
              {.rank = rank,
               .peer = status.source,
               .operation = std::string("torch ") + title,
               .tag = static_cast<std::uint64_t>(to_underlying(status.tag)),
               .cause = "received " + std::to_string(status.bytes) + " bytes into a tensor of " +
                        std::to_string(bytes) + " (the sender's tensor is smaller)"});
        recv.write_back();
      });
}

ProcessGroupAnview::WorkPtr ProcessGroupAnview::recv(Tensors& tensors, int src, int tag) {
  return receive(tensors, src, tag, OpType::RECV, "recv");
}

ProcessGroupAnview::WorkPtr ProcessGroupAnview::recvAnysource(Tensors& tensors, int tag) {
  return receive(tensors, any_source, tag, OpType::RECVANYSOURCE, "recv");
}

}  // namespace anview::torch_backend
