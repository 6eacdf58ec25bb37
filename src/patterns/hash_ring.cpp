#include <algorithm>

#include "anview/error.hpp"
#include "anview/param_server.hpp"

namespace anview {
namespace {

// FNV-1a, then splitmix64's finalizer: FNV alone spreads similar names ("host:7001",
// "host:7002") poorly over the ring.
std::uint64_t ring_hash(std::string_view text) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

}  // namespace

HashRing::HashRing(std::vector<std::string> servers, int virtual_nodes)
    : servers_(std::move(servers)), virtual_nodes_(virtual_nodes) {
  if (virtual_nodes_ < 1)
    throw Error(ErrorKind::usage, {.operation = "hash ring",
                                   .cause = "virtual_nodes is " + std::to_string(virtual_nodes_)});
  std::sort(servers_.begin(), servers_.end());
  servers_.erase(std::unique(servers_.begin(), servers_.end()), servers_.end());
  rebuild();
}

void HashRing::add(const std::string& server) {
  if (std::find(servers_.begin(), servers_.end(), server) != servers_.end()) return;
  servers_.push_back(server);
  std::sort(servers_.begin(), servers_.end());
  rebuild();
}

void HashRing::remove(const std::string& server) {
  std::erase(servers_, server);
  rebuild();
}

void HashRing::rebuild() {
  points_.clear();
  points_.reserve(servers_.size() * static_cast<std::size_t>(virtual_nodes_));
  for (std::size_t s = 0; s < servers_.size(); ++s) {
    for (int v = 0; v < virtual_nodes_; ++v)
      points_.emplace_back(ring_hash(servers_[s] + "#" + std::to_string(v)), s);
  }
  std::sort(points_.begin(), points_.end());
}

const std::string& HashRing::owner(std::string_view key) const {
  if (points_.empty())
    throw Error(ErrorKind::usage, {.operation = "hash ring", .cause = "the ring has no server"});
  const std::uint64_t h = ring_hash(key);
  auto it = std::lower_bound(points_.begin(), points_.end(), std::make_pair(h, std::size_t{0}));
  if (it == points_.end()) it = points_.begin();
  return servers_[it->second];
}

}  // namespace anview
