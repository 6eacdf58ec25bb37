// Where the tuner's cost model comes from: measured on the job itself the first time a
// collective has a choice to make (a quick probe, a few milliseconds), or read from a tuning
// file that an earlier run of the same placement wrote (ANVIEW_TUNING_FILE). Either way every
// rank ends with the same values, so every rank picks the same algorithms.
#pragma once

#include <cstdint>

#include "collectives/algorithms.hpp"
#include "collectives/cost_model.hpp"
#include "collectives/direct.hpp"
#include "collectives/hierarchical.hpp"
#include "collectives/shared.hpp"

namespace anview::collectives {

// What the job can use, agreed by every rank.
struct Placement {
  int bits = 0;                         // identifies it: a tuning file of other bits is not reused
  const SharedAreas* areas = nullptr;   // every rank's shared area (null: not all mapped)
  const PeerMemories* peers = nullptr;  // every rank's memory readable (null: not all)
  const HostLayout* layout = nullptr;   // the hosts: inside-host costs measured when several
};

// A collective of its own on `call`. The shared-memory flags are timed when `where.areas` is
// set (numbering those calls with `shared_calls`, like every shared collective), peer reads
// when `where.peers` is.
CostModel tune(Call& call, const Placement& where, std::uint64_t& shared_calls);

}  // namespace anview::collectives
