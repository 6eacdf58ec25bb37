// Broadcast down a chain root -> root+1 -> ... -> root-1, pipelined: the data travels in chunks
// of call.chunk_bytes and each rank forwards a chunk as soon as it has it, while the later ones
// are still on their way. Past a start-up of n-1 chunks all links work at the same time, each
// carrying the buffer once: large buffers, where the binomial tree has the root send all of it
// log2(n) times.
#include <algorithm>
#include <cstddef>
#include <vector>

#include "collectives/algorithms.hpp"
#include "collectives/steps.hpp"

namespace anview::collectives {

void broadcast_chain(Call& call, void* data, std::size_t bytes, int root) {
  const int n = call.size;
  const int vr = mod(call.rank - root, n);
  const int prev = mod(call.rank - 1, n);
  const int next = mod(call.rank + 1, n);
  auto* base = static_cast<char*>(data);
  const std::size_t chunk = std::max<std::size_t>(call.chunk_bytes, 1);
  // At least one chunk: zero bytes still go down the chain, as one empty message.
  const std::size_t chunks = std::max<std::size_t>((bytes + chunk - 1) / chunk, 1);
  auto chunk_bytes = [&](std::size_t k) { return std::min(chunk, bytes - k * chunk); };
  // Every receive is posted before the first chunk can arrive, so none arrives unexpected
  // (an unexpected chunk costs an allocation and a second copy).
  std::vector<RequestPtr> recvs;
  if (vr > 0) {
    recvs.reserve(chunks);
    for (std::size_t k = 0; k < chunks; ++k)
      recvs.push_back(post_recv(call, base + k * chunk, chunk_bytes(k), prev));
  }
  std::vector<RequestPtr> sends;
  sends.reserve(chunks);
  for (std::size_t k = 0; k < chunks; ++k) {
    if (vr > 0) {
      wait(call, recvs[k]);
      check_size(call, recvs[k], chunk_bytes(k), prev);
    }
    if (vr < n - 1) sends.push_back(post_send(call, base + k * chunk, chunk_bytes(k), next));
  }
  for (auto& s : sends) wait(call, s);
}

}  // namespace anview::collectives
