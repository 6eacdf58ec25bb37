#include "transport/tcp/paths.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdint>
#include <optional>

#include "base/socket.hpp"

namespace anview::transport::tcp {
namespace {

std::optional<std::uint32_t> parse_ipv4(const std::string& ip) {
  in_addr a{};
  if (::inet_pton(AF_INET, ip.c_str(), &a) != 1) return std::nullopt;
  return ntohl(a.s_addr);
}

std::string host_of(const std::string& host_port) {
  std::string host;
  std::uint16_t port = 0;
  return base::split_host_port(host_port, &host, &port) ? host : host_port;
}

bool is_loopback_ip(const std::string& ip) {
  return ip.rfind("127.", 0) == 0;
}

}  // namespace

std::string PathPlan::describe() const {
  return (local_ip.empty() ? std::string("*") : local_ip) + " -> " + remote;
}

bool same_subnet(const std::string& ip, const std::string& subnet_ip, int prefix_len) {
  const auto a = parse_ipv4(ip);
  const auto b = parse_ipv4(subnet_ip);
  if (!a || !b || prefix_len <= 0 || prefix_len > 32) return false;
  const std::uint32_t mask = prefix_len == 32 ? ~0u : ~((1u << (32 - prefix_len)) - 1);
  return (*a & mask) == (*b & mask);
}

std::vector<PathPlan> plan_paths(const std::vector<LocalAddress>& local,
                                 const std::vector<std::string>& remote, bool same_host,
                                 int max_paths) {
  std::vector<PathPlan> out;
  std::vector<std::string> remote_ips;
  for (const auto& r : remote) remote_ips.push_back(host_of(r));
  if (same_host) {
    for (std::size_t i = 0; i < remote.size(); ++i)
      if (is_loopback_ip(remote_ips[i])) return {PathPlan{"", remote[i]}};
  }
  std::vector<bool> used(remote.size(), false);
  for (const auto& l : local) {
    if (static_cast<int>(out.size()) >= max_paths) break;
    if (is_loopback_ip(l.ip) || !parse_ipv4(l.ip)) continue;
    for (std::size_t i = 0; i < remote.size(); ++i) {
      if (used[i] || is_loopback_ip(remote_ips[i])) continue;
      if (!same_subnet(remote_ips[i], l.ip, l.prefix_len)) continue;
      used[i] = true;
      out.push_back(PathPlan{l.ip, remote[i]});
      break;
    }
  }
  if (!out.empty()) return out;
  for (std::size_t i = 0; i < remote.size(); ++i)
    if (!is_loopback_ip(remote_ips[i]) && parse_ipv4(remote_ips[i]))
      return {PathPlan{"", remote[i]}};
  return {};
}

}  // namespace anview::transport::tcp
