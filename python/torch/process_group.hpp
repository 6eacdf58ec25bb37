// ProcessGroupAnview: PyTorch's c10d ProcessGroup on an anview::Communicator. torch's store
// serves only the bootstrap; tensors move over Anview's transports (shared memory on one host,
// TCP between hosts) with the algorithms its tuner picks. Every operation is started at once
// (collectives on the communicator's collective thread, in call order) and returns an
// AnviewWork; CPU tensors only.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "anview/anview.hpp"
#include "work.hpp"

namespace anview::torch_backend {

class ProcessGroupAnview final : public c10d::ProcessGroup {
 public:
  // Bootstraps a communicator of `size` ranks through `store` (every rank calls it).
  static c10::intrusive_ptr<c10d::ProcessGroup> create(const c10::intrusive_ptr<c10d::Store>& store,
                                                       int rank, int size,
                                                       std::chrono::milliseconds timeout);

  ProcessGroupAnview(Communicator comm, std::chrono::milliseconds timeout);
  ~ProcessGroupAnview() override;

  const std::string getBackendName() const override { return "anview"; }
  Communicator& communicator() { return comm_; }

  using Tensors = std::vector<at::Tensor>;
  using WorkPtr = c10::intrusive_ptr<c10d::Work>;

  WorkPtr broadcast(Tensors& tensors, const c10d::BroadcastOptions& opts) override;
  WorkPtr allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts) override;
  WorkPtr allreduce_coalesced(Tensors& tensors,
                              const c10d::AllreduceCoalescedOptions& opts) override;
  WorkPtr reduce(Tensors& tensors, const c10d::ReduceOptions& opts) override;
  WorkPtr allgather(std::vector<Tensors>& outputs, Tensors& inputs,
                    const c10d::AllgatherOptions& opts) override;
  WorkPtr _allgather_base(at::Tensor& output, at::Tensor& input,
                          const c10d::AllgatherOptions& opts) override;
  WorkPtr allgather_coalesced(std::vector<Tensors>& output_lists, Tensors& inputs,
                              const c10d::AllgatherOptions& opts) override;
  WorkPtr gather(std::vector<Tensors>& outputs, Tensors& inputs,
                 const c10d::GatherOptions& opts) override;
  WorkPtr scatter(Tensors& outputs, std::vector<Tensors>& inputs,
                  const c10d::ScatterOptions& opts) override;
  WorkPtr reduce_scatter(Tensors& outputs, std::vector<Tensors>& inputs,
                         const c10d::ReduceScatterOptions& opts) override;
  WorkPtr _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                               const c10d::ReduceScatterOptions& opts) override;
  WorkPtr alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                        std::vector<int64_t>& input_splits,
                        const c10d::AllToAllOptions& opts) override;
  WorkPtr alltoall(Tensors& outputs, Tensors& inputs, const c10d::AllToAllOptions& opts) override;
  WorkPtr send(Tensors& tensors, int dst, int tag) override;
  WorkPtr recv(Tensors& tensors, int src, int tag) override;
  WorkPtr recvAnysource(Tensors& tensors, int tag) override;
  WorkPtr barrier(const c10d::BarrierOptions& opts) override;

  void setSequenceNumberForGroup() override { sequence_ = 0; }
  uint64_t getSequenceNumberForGroup() override { return sequence_; }

 private:
  struct Launch {
    c10d::OpType type;
    const char* title;
    std::chrono::milliseconds timeout;  // the options' (kUnsetTimeout: the group's)
    Tensors outputs;
    Tensors held;
    bool point_to_point = false;
  };
  WorkPtr launch(Launch launch, const std::function<Request()>& start,
                 AnviewWork::Finish finish = {});
  // The receive of recv / recvAnysource; `source` may be any_source.
  WorkPtr receive(Tensors& tensors, int source, int tag, c10d::OpType type, const char* title);

  Communicator comm_;
  std::chrono::milliseconds timeout_;
  std::atomic<uint64_t> sequence_{0};
  std::shared_ptr<Retired> retired_ = std::make_shared<Retired>();
  std::shared_ptr<ProgressHelper> helper_ = std::make_shared<ProgressHelper>();
};

}  // namespace anview::torch_backend
