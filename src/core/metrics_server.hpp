// ANVIEW_METRICS_PORT=P: while communicators live, the process serves its metrics over HTTP
// on port P + its local rank (ANVIEW_METRICS_ADDR, default all interfaces): GET /metrics in
// the Prometheus text format, GET /metrics.json as JSON (include/anview/metrics.hpp). One
// thread, started with the first communicator and stopped with the last; a port that is taken
// is logged once and the job goes on without it.
#pragma once

#include <cstdint>
#include <mutex>
#include <thread>

#include "base/socket.hpp"

namespace anview::detail {

class MetricsServer {
 public:
  static MetricsServer& instance();

  // A communicator of communicator rank `rank` opens / closes.
  void attach(int rank);
  void detach();

 private:
  MetricsServer() = default;
  void start(int port);  // mu_ held
  void stop();           // mu_ held
  void serve(int wake_fd, int listen_fd);
  static void answer(int client_fd);

  std::mutex mu_;
  int users_ = 0;
  std::thread thread_;
  base::Fd wake_read_, wake_write_;
  base::Fd listen_;
};

}  // namespace anview::detail
