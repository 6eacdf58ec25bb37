// Same-host collectives that read their peers' buffers (transport::PeerMemory: cross-memory
// attach) instead of streaming them through messages. A call starts with every rank telling
// every other one what it was called with and where its buffers are (a Posting); a rank whose
// arguments differ from a peer's fails at once with a usage Error naming both.
//
// Reads only, never writes: a rank that fails or is killed never had peers writing into its
// memory, and a rank only reads a peer's buffer between the peer's "ready" and its own "done"
// message, so nobody returns from the call while someone still reads its buffers.
#pragma once

#include <cstddef>
#include <vector>

#include "collectives/algorithms.hpp"
#include "transport/transport.hpp"

namespace anview::collectives {

// Every rank's memory, by rank (null for this rank).
using PeerMemories = std::vector<const transport::PeerMemory*>;

// allreduce of `count` elements from `send` into `recv` (the same buffer, or disjoint), avg
// already divided on return. Each rank reduces its own segment reading the others' send
// buffers, then copies the other segments from their owners' receive buffers: every byte
// crosses between processes twice, with no messages per chunk.
void allreduce_direct(Call& call, const PeerMemories& peers, const void* send, void* recv,
                      std::size_t count, DataType type, ReduceOp op);

}  // namespace anview::collectives
