// Which network paths connect this rank to a peer on another host: pairs of a local interface
// address and a peer address on the same subnet, each interface used once on each side, so a
// second NIC carries traffic instead of idling. Private to transport/tcp.
#pragma once

#include <string>
#include <vector>

namespace anview::transport::tcp {

struct LocalAddress {
  std::string ip;      // "10.0.1.1"
  int prefix_len = 0;  // its subnet: 24 for 10.0.1.0/24
};

struct PathPlan {
  std::string local_ip;  // the source address to bind; empty: let the kernel's routes choose
  std::string remote;    // "ip:port" of the peer
  std::string describe() const;  // "10.0.1.1 -> 10.0.1.2:4242"
};

// IPv4 only. A same-host peer is reached over one loopback path. For another host: every local
// address (in preference order) paired with the first unused peer address in its subnet, at
// most `max_paths`; when no subnet is shared, one path to the peer's first non-loopback
// address through the routing table. Empty when the peer published nothing usable.
std::vector<PathPlan> plan_paths(const std::vector<LocalAddress>& local,
                                 const std::vector<std::string>& remote, bool same_host,
                                 int max_paths);

// True when `ip` lies in `subnet_ip`/`prefix_len` (both dotted IPv4).
bool same_subnet(const std::string& ip, const std::string& subnet_ip, int prefix_len);

}  // namespace anview::transport::tcp
