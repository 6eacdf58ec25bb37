// anview-perf pubsub: rank 0 publishes as fast as it can to a subscriber on rank 1 that
// connected by address, like ../shared/peers/zmq_pubsub.cc: per size a warm-up, then a window
// of fixed length, then the end of the stream. msgs_per_s and gbs are measured at the
// subscriber over the window; delivered and dropped cover the whole run.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "anview/anview.hpp"

namespace perf {

struct PubSubOptions {
  std::vector<std::size_t> sizes;
  double seconds = 3.0;
  double warmup = 0.5;
  anview::Backpressure policy = anview::Backpressure::block;
  std::string listen = "127.0.0.1:0";
  bool check = false;
  bool json = false;
};

// Returns the messages that arrived wrong (or lost under the block policy).
long run_pubsub(anview::Communicator& comm, const PubSubOptions& options);

}  // namespace perf
