// The ordered transport registry (NCCL's ncclTransports[] + canConnect): ANVIEW_TRANSPORTS lists
// the transports to try, in order; each peer is served by the first one that can reach it.
// A rank reaches itself through "self", whatever the list says.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/transport.hpp"

namespace anview::transport {

// The transports named by ANVIEW_TRANSPORTS, created in that order. An unknown name raises a
// usage Error listing the known ones.
std::vector<std::unique_ptr<Transport>> create_transports(const TransportContext& context);

// The names this build knows, in default preference order.
std::vector<std::string> known_transports();

struct Selection {
  Transport* transport = nullptr;  // null: no transport can reach the peer
  std::string reason;              // why this one, or why none
};

// What one transport can do on this machine, found without creating a communicator (for
// anview-info). A transport that cannot run here is not an error: `usable` and `detail` say why.

// Probes every transport of known_transports(), in that order. Blocks briefly (system calls
// only); any thread.
std::vector<TransportProbe> probe_transports();

// Picks the transport for `peer`: self for our own rank, else the first of `ordered` that can
// reach it. The reason names the rejected candidates and why.
Selection select_transport(const std::vector<std::unique_ptr<Transport>>& ordered, Transport& self,
                           const PeerInfo& peer);

}  // namespace anview::transport
