// Same-host collectives that read and write their peers' buffers (transport::PeerMemory:
// cross-memory attach) instead of streaming them through messages. A call starts with every rank
// telling every other one what it was called with and where its buffers are (a Posting); a rank
// whose arguments differ from a peer's fails at once with a usage Error naming both.
//
// A rank reads its peers' send buffers and writes into their receive buffers. It writes into a
// peer only after the peer's "go" (the peer has every posting and takes part), and a rank that
// said go returns, with or without an error, only after the "done" of every peer that said go
// to it (or once that peer is lost, or the call's timeout passed again, which is logged): no
// rank returns while a peer still writes into its memory. A peer whose word did not come in
// time may only be late and say go after all: its word is awaited once more (one more timeout)
// before the call fails. A rank that gives up before the call starts (a rank lost or late)
// says "no-go" instead; ranks that disagree about the call all fail before any word is said.
#pragma once

#include <cstddef>
#include <vector>

#include "collectives/algorithms.hpp"
#include "transport/transport.hpp"

namespace anview::collectives {

// Every rank's memory, by rank (null for this rank).
using PeerMemories = std::vector<const transport::PeerMemory*>;

// allreduce of `count` elements from `send` into `recv` (the same buffer, or disjoint), avg
// already divided on return. Each rank reduces its own segment a chunk at a time, reading the
// others' send buffers, and writes each reduced chunk into every peer's receive buffer while it
// is in cache: every byte crosses between processes twice, with no messages per chunk.
void allreduce_direct(Call& call, const PeerMemories& peers, const void* send, void* recv,
                      std::size_t count, DataType type, ReduceOp op);

// reduce_scatter of `count` elements per rank: block r of every rank's `send` (count * size
// elements) reduced into rank r's `recv`, avg already divided. Each rank reads its block from
// every peer's send buffer and reduces it a chunk at a time: every byte crosses once, nothing
// is written into peers. `recv` may be this rank's own block of `send`.
void reduce_scatter_direct(Call& call, const PeerMemories& peers, const void* send, void* recv,
                           std::size_t count, DataType type, ReduceOp op);

}  // namespace anview::collectives
