// Network interfaces and host identity: which addresses a rank publishes for its peers.
#pragma once

#include <string>
#include <vector>

namespace anview::bootstrap {

struct Interface {
  std::string name;     // "eth0"
  std::string address;  // numeric, without port: "10.0.0.2", "fe80::1"
  int family = 0;       // AF_INET / AF_INET6
  bool up = false;      // IFF_UP and IFF_RUNNING
  bool loopback = false;
  bool link_local = false;  // 169.254/16, fe80::/10
  int prefix_len = 0;       // netmask length: 24 for 255.255.255.0
};

// Every address of every interface (getifaddrs).
std::vector<Interface> list_interfaces();

// The addresses to publish, in preference order, without duplicates. Down and link-local
// addresses are skipped. When `wanted` is empty: every other address in `interfaces` order,
// loopback addresses last and only when `include_loopback`. When `wanted` (ANVIEW_IFACES) is
// not empty, only interfaces named there are used, in that order (a loopback interface named
// there is used whatever `include_loopback` says), and a name that does not exist on this
// host raises a usage Error naming it; so does a name that exists but is down or has only
// link-local addresses.
std::vector<std::string> select_addresses(const std::vector<Interface>& interfaces,
                                          const std::vector<std::string>& wanted,
                                          bool include_loopback);

// The ANVIEW_IFACES setting as a list ("eth0,ib0" -> {"eth0", "ib0"}); empty when unset.
// A setting of component "bootstrap", declared in interfaces.cpp.
std::vector<std::string> wanted_interfaces();

// Identifies this host: ANVIEW_HOST_ID if set, else hostname + ":" + kernel boot id
// (/proc/sys/kernel/random/boot_id; hostname alone where that is unreadable). Ranks with the
// same host id can reach each other over loopback and shared memory.
std::string host_id();

}  // namespace anview::bootstrap
