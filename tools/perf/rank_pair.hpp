// The two-process benchmarks (rpc, pubsub): rank 0 serves at an address it tells the others;
// a measuring rank tells the others its verdict.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "anview/anview.hpp"

namespace perf {

// Rank 0's `address` on every rank (the argument matters on rank 0 only).
inline std::string share_address(anview::Communicator& comm, std::string address) {
  std::uint64_t length = address.size();
  comm.broadcast(&length, 1, anview::DataType::uint64, 0);
  address.resize(length);
  comm.broadcast(address.data(), length, anview::DataType::uint8, 0);
  return address;
}

// Rank `from` sends `wrong` to every other rank, which waits for it in a plain receive: it
// sleeps in the kernel meanwhile. (A collective's wait polls, and its wake-ups take turns with
// the spinning threads a benchmark measures on a small machine: 64 B RPC p99 56 us with a
// broadcast here, 4 us with this.)
inline long share_verdict(anview::Communicator& comm, long wrong, int from) {
  if (comm.rank() == from) {
    for (int r = 0; r < comm.size(); ++r)
      if (r != from) comm.send(&wrong, sizeof wrong, r, anview::Tag{1});
  } else {
    comm.recv(&wrong, sizeof wrong, from, anview::Tag{1}, std::chrono::hours(24));
  }
  return wrong;
}

}  // namespace perf
