#include "bootstrap/interfaces.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>

#include "anview/error.hpp"
#include "base/config.hpp"
#include "base/socket.hpp"

namespace anview::bootstrap {
namespace {

const base::Setting ifaces_setting(
    "bootstrap", "ANVIEW_IFACES", "",
    "Network interfaces whose addresses a rank publishes, in preference order (comma "
    "separated, e.g. eth0,ib0); empty: every interface that is up");
const base::Setting host_id_setting(
    "bootstrap", "ANVIEW_HOST_ID", "",
    "Identity of this host; ranks with the same id use loopback and shared memory between "
    "them (default: hostname and kernel boot id)");

bool is_link_local(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) {
    const auto addr = ntohl(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr);
    return (addr & 0xFFFF0000u) == 0xA9FE0000u;  // 169.254.0.0/16
  }
  if (sa->sa_family == AF_INET6) {
    const auto* a = &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
    return IN6_IS_ADDR_LINKLOCAL(a);  // fe80::/10
  }
  return false;
}

bool usable(const Interface& i) {
  return i.up && !i.link_local;
}

}  // namespace

std::vector<Interface> list_interfaces() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0)
    throw base::sys_error(ErrorKind::internal, {.operation = "bootstrap.list_interfaces"},
                          "getifaddrs()", errno);
  std::vector<Interface> out;
  for (const ifaddrs* p = list; p != nullptr; p = p->ifa_next) {
    if (p->ifa_addr == nullptr) continue;
    const int family = p->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    char text[INET6_ADDRSTRLEN] = {};
    const void* raw =
        family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(p->ifa_addr)->sin_addr)
            : static_cast<const void*>(
                  &reinterpret_cast<const sockaddr_in6*>(p->ifa_addr)->sin6_addr);
    if (::inet_ntop(family, raw, text, sizeof text) == nullptr) continue;
    int prefix_len = 0;
    if (p->ifa_netmask != nullptr && family == AF_INET) {
      prefix_len =
          __builtin_popcount(reinterpret_cast<const sockaddr_in*>(p->ifa_netmask)->sin_addr.s_addr);
    } else if (p->ifa_netmask != nullptr) {
      for (const auto byte :
           reinterpret_cast<const sockaddr_in6*>(p->ifa_netmask)->sin6_addr.s6_addr)
        prefix_len += __builtin_popcount(byte);
    }
    out.push_back({.name = p->ifa_name ? p->ifa_name : "",
                   .address = text,
                   .family = family,
                   .up = (p->ifa_flags & IFF_UP) && (p->ifa_flags & IFF_RUNNING),
                   .loopback = (p->ifa_flags & IFF_LOOPBACK) != 0,
                   .link_local = is_link_local(p->ifa_addr),
                   .prefix_len = prefix_len});
  }
  ::freeifaddrs(list);
  return out;
}

std::vector<std::string> select_addresses(const std::vector<Interface>& interfaces,
                                          const std::vector<std::string>& wanted,
                                          bool include_loopback) {
  std::vector<std::string> out;
  const auto add = [&out](const std::string& address) {
    if (std::find(out.begin(), out.end(), address) == out.end()) out.push_back(address);
  };
  if (wanted.empty()) {
    // Every usable address, loopback ones last.
    for (const Interface& i : interfaces)
      if (usable(i) && !i.loopback) add(i.address);
    if (include_loopback)
      for (const Interface& i : interfaces)
        if (usable(i) && i.loopback) add(i.address);
    return out;
  }
  const auto fail = [](const std::string& cause) {
    throw Error(ErrorKind::usage,
                {.operation = "bootstrap.select_addresses", .cause = cause + " (ANVIEW_IFACES)"});
  };
  for (const std::string& name : wanted) {
    bool exists = false;
    bool up = false;
    bool any_usable = false;
    for (const Interface& i : interfaces) {
      if (i.name != name) continue;
      exists = true;
      up = up || i.up;
      // Naming a loopback interface in `wanted` asks for it, whatever include_loopback says.
      if (usable(i)) {
        any_usable = true;
        add(i.address);
      }
    }
    if (!exists) {
      std::string names;
      for (const Interface& i : interfaces)
        if (names.find("'" + i.name + "'") == std::string::npos)
          names += (names.empty() ? "'" : ", '") + i.name + "'";
      fail("no network interface named '" + name + "' on this host (there are: " + names + ")");
    }
    if (!up) fail("network interface '" + name + "' is down");
    if (!any_usable) fail("network interface '" + name + "' has only link-local addresses");
  }
  return out;
}

std::vector<std::string> wanted_interfaces() {
  return ifaces_setting.as_list();
}

std::string host_id() {
  if (host_id_setting.from_environment() && !host_id_setting.value().empty())
    return host_id_setting.value();
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) name[0] = '\0';
  std::string id = name[0] ? name : "localhost";
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  if (boot && std::getline(boot, boot_id)) {
    boot_id.erase(boot_id.find_last_not_of(" \t\r\n") + 1);
    if (!boot_id.empty()) id += ":" + boot_id;
  }
  return id;
}

}  // namespace anview::bootstrap
