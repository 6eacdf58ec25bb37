// The UCP context and worker one UCX transport owns (UCX's own objects, wrapped so they are
// released in order whatever fails), and what UCX finds on this machine.
//
// Threading: the worker is created UCS_THREAD_MODE_SERIALIZED: the transport's owner lock
// serialises every call, from whichever thread drives progress.
#pragma once

#include <ucp/api/ucp.h>

#include <string>
#include <vector>

namespace anview::transport::ucx {

// The transports and devices UCX reports here (uct's component and memory-domain queries).
struct DeviceReport {
  std::vector<std::string> rdma;   // "rc_mlx5/mlx5_0:1": reliable/dynamic/unreliable connected
  std::vector<std::string> other;  // "tcp/eth0", "posix/memory", ...
  std::string error;               // set when UCX could not be queried at all
};

// Queried once per process (it opens every memory domain), then cached.
const DeviceReport& devices();

// True for UCX transport names that drive an RDMA device (InfiniBand, RoCE, iWARP): rc*, dc*,
// ud* (rc_verbs, rc_mlx5, dc_mlx5, ud_verbs, ud_mlx5, ...).
bool is_rdma_transport(const std::string& tl_name);

// Whether UCX_TLS (`tls`, "all" when unset) lets UCX use shared memory between processes of
// one host (sm, shm, posix, sysv, cma, knem, xpmem), or an RDMA transport (ib, rc*, dc*,
// ud*). An exclusion list ("^tcp,cma") allows what it does not name.
bool tls_allows_shared_memory(const std::string& tls);
bool tls_allows_rdma(const std::string& tls);

// "UCS_ERR_UNREACHABLE (Destination is unreachable)".
std::string status_text(ucs_status_t status);

class Worker {
 public:
  // Creates a context (active messages, wake-up, one-sided) and a worker. On failure the
  // worker is not valid() and `error` says why.
  Worker();
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  bool valid() const { return worker_ != nullptr; }
  const std::string& error() const { return error_; }
  ucp_context_h context() const { return context_; }
  ucp_worker_h get() const { return worker_; }
  int event_fd() const { return event_fd_; }
  // The worker's address, which peers create their endpoints from.
  const std::string& address() const { return address_; }
  // UCX_TLS as UCX read it ("all" unless set).
  const std::string& tls() const { return tls_; }

 private:
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;
  std::string address_;
  std::string tls_ = "all";
  std::string error_;
};

}  // namespace anview::transport::ucx
