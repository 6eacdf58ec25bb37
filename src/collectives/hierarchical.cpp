#include "collectives/hierarchical.hpp"

#include <algorithm>

namespace anview::collectives {

HostLayout HostLayout::from_keys(const std::vector<std::uint64_t>& keys) {
  HostLayout layout;
  layout.host_of.assign(keys.size(), -1);
  layout.position.assign(keys.size(), 0);
  for (std::size_t r = 0; r < keys.size(); ++r) {
    if (layout.host_of[r] >= 0) continue;
    const int host = static_cast<int>(layout.hosts.size());
    auto& members = layout.hosts.emplace_back();
    for (std::size_t q = r; q < keys.size(); ++q) {
      if (keys[q] != keys[r]) continue;
      layout.host_of[q] = host;
      layout.position[q] = static_cast<int>(members.size());
      members.push_back(static_cast<int>(q));
    }
    layout.leaders.push_back(static_cast<int>(r));
    layout.largest = std::max(layout.largest, static_cast<int>(members.size()));
  }
  return layout;
}

void allreduce_hierarchical(Call& call, const HostLayout& layout, const std::string& among_leaders,
                            void* data, std::size_t count, DataType type, ReduceOp op) {
  const auto me = static_cast<std::size_t>(call.rank);
  const auto& host = layout.hosts[static_cast<std::size_t>(layout.host_of[me])];
  Call local = call.among(host, layout.position[me]);
  if (local.size > 1) reduce_binomial(local, data, count, type, op, 0);  // to the leader
  if (local.rank == 0 && layout.leaders.size() > 1) {
    Call leaders = call.among(layout.leaders, layout.host_of[me]);
    if (among_leaders == "ring" && count >= layout.leaders.size())
      allreduce_ring(leaders, data, count, type, op);
    else if (among_leaders == "rabenseifner")
      allreduce_rabenseifner(leaders, data, count, type, op);
    else
      allreduce_recursive_doubling(leaders, data, count, type, op);
  }
  if (local.size > 1) broadcast_binomial(local, data, count * size_of(type), 0);
}

}  // namespace anview::collectives
