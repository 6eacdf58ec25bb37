#include "collectives/hierarchical.hpp"

#include <algorithm>
#include <cstring>

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
  if (local.size > 1) reduce_binomial(local, data, data, count, type, op, 0);  // to the leader
  if (local.rank == 0 && layout.leaders.size() > 1) {
    Call leaders = call.among(layout.leaders, layout.host_of[me]);
    if (among_leaders == "ring" && count >= layout.leaders.size())
      allreduce_ring(leaders, data, data, count, type, op);
    else if (among_leaders == "rabenseifner")
      allreduce_rabenseifner(leaders, data, data, count, type, op);
    else
      allreduce_recursive_doubling(leaders, data, count, type, op);
  }
  if (local.size > 1) broadcast_binomial(local, data, count * size_of(type), 0);
}

namespace {

// One rank per host: `root` on its own host, the leader elsewhere.
std::vector<int> representatives(const HostLayout& layout, int root) {
  std::vector<int> reps = layout.leaders;
  reps[static_cast<std::size_t>(layout.host_of[static_cast<std::size_t>(root)])] = root;
  return reps;
}

void broadcast_by(const std::string& algorithm, Call& call, void* data, std::size_t bytes,
                  int root) {
  if (algorithm == "chain")
    broadcast_chain(call, data, bytes, root);
  else
    broadcast_binomial(call, data, bytes, root);
}

}  // namespace

void broadcast_hierarchical(Call& call, const HostLayout& layout, const BroadcastSteps& steps,
                            void* data, std::size_t bytes, int root) {
  const auto me = static_cast<std::size_t>(call.rank);
  const int host_index = layout.host_of[me];
  const std::vector<int> reps = representatives(layout, root);
  const int rep = reps[static_cast<std::size_t>(host_index)];
  if (call.rank == rep && reps.size() > 1) {
    Call among = call.among(reps, host_index);
    broadcast_by(steps.between, among, data, bytes, layout.host_of[static_cast<std::size_t>(root)]);
  }
  const auto& host = layout.hosts[static_cast<std::size_t>(host_index)];
  if (host.size() > 1) {
    Call local = call.among(host, layout.position[me]);
    broadcast_by(steps.within, local, data, bytes, layout.position[static_cast<std::size_t>(rep)]);
  }
}

void reduce_hierarchical(Call& call, const HostLayout& layout, void* data, std::size_t count,
                         DataType type, ReduceOp op, int root) {
  const auto me = static_cast<std::size_t>(call.rank);
  const int host_index = layout.host_of[me];
  const std::vector<int> reps = representatives(layout, root);
  const int rep = reps[static_cast<std::size_t>(host_index)];
  const auto& host = layout.hosts[static_cast<std::size_t>(host_index)];
  if (host.size() > 1) {
    Call local = call.among(host, layout.position[me]);
    reduce_binomial(local, data, data, count, type, op,
                    layout.position[static_cast<std::size_t>(rep)]);
  }
  if (call.rank == rep && reps.size() > 1) {
    Call among = call.among(reps, host_index);
    reduce_binomial(among, data, data, count, type, op,
                    layout.host_of[static_cast<std::size_t>(root)]);
  }
}

void allgather_hierarchical(Call& call, const HostLayout& layout, const std::string& within,
                            void* data, std::size_t block) {
  const auto me = static_cast<std::size_t>(call.rank);
  const int host_index = layout.host_of[me];
  const auto& host = layout.hosts[static_cast<std::size_t>(host_index)];
  auto* all = static_cast<char*>(data);
  Call local = call.among(host, layout.position[me]);
  if (local.rank == 0) {
    // Host h's blocks, in its ranks' order, at the sum of the earlier hosts' sizes.
    Blocks packs;
    bool consecutive = true;
    std::size_t offset = 0;
    for (const auto& members : layout.hosts) {
      packs.offset.push_back(offset);
      packs.bytes.push_back(members.size() * block);
      for (std::size_t i = 0; i < members.size(); ++i)
        consecutive =
            consecutive && static_cast<std::size_t>(members[i]) * block == offset + i * block;
      offset += members.size() * block;
    }
    char* packed = consecutive ? all : call.scratch_bytes(offset);
    char* mine = packs.at(packed, host_index);
    gather_linear(local, all + me * block, block, mine, Blocks::uniform(local.size, block), 0);
    if (layout.leaders.size() > 1) {
      Call leaders = call.among(layout.leaders, host_index);
      allgather_ring(leaders, packed, packs);
    }
    if (!consecutive) {
      for (std::size_t h = 0; h < layout.hosts.size(); ++h) {
        const auto& members = layout.hosts[h];
        for (std::size_t i = 0; i < members.size(); ++i) {
          if (block > 0)
            std::memcpy(all + static_cast<std::size_t>(members[i]) * block,
                        packed + packs.offset[h] + i * block, block);
        }
      }
    }
  } else {
    gather_linear(local, all + me * block, block, nullptr, Blocks::uniform(local.size, block), 0);
  }
  if (local.size > 1)
    broadcast_by(within, local, data, block * static_cast<std::size_t>(call.size), 0);
}

}  // namespace anview::collectives
