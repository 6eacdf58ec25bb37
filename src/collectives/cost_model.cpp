#include "collectives/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace anview::collectives {
namespace {

int ceil_log2(int n) {
  int rounds = 0;
  while ((1 << rounds) < n) ++rounds;
  return rounds;
}

int floor_pow2(int n) {
  int pof2 = 1;
  while (pof2 * 2 <= n) pof2 *= 2;
  return pof2;
}

// The cost terms of one model, in microseconds.
struct Terms {
  const CostModel& m;
  double eager_bytes;
  // The latency of one message: a rendezvous-sized one waits for a handshake first.
  double alpha(double bytes) const { return bytes > eager_bytes ? 3 * m.alpha_us : m.alpha_us; }
  double send(double bytes) const { return alpha(bytes) + bytes / m.link_bpus; }
  // The latencies of `rounds` messages of half the buffer, a quarter, ... (recursive halving).
  double halving_alphas(double bytes, int rounds) const {
    double us = 0;
    for (int k = 1; k <= rounds; ++k) us += alpha(bytes / (1 << k));
    return us;
  }
  // The latencies of a ring step's `segment` sent in pieces of at most `chunk_bytes`.
  double chunked_alphas(double segment, std::size_t chunk_bytes) const {
    const double chunk =
        std::min(segment, static_cast<double>(std::max<std::size_t>(chunk_bytes, 1)));
    return std::max(1.0, std::ceil(segment / chunk)) * alpha(chunk);
  }
  double reduce(double bytes) const { return crowded(bytes / m.reduce_bpus); }
  double copy(double bytes) const { return crowded(bytes / m.copy_bpus); }
  // Reading (or writing) `bytes` of a same-host peer's memory as the direct algorithms do, a
  // cache-sized unit per system call: cross-memory attach where it was measured, else what a
  // message of the same size costs.
  double peer_copy(double bytes) const {
    if (m.read_bpus <= 0) return bytes / m.link_bpus;
    return crowded(std::max(1.0, std::ceil(bytes / direct_unit_bytes)) * m.read_us +
                   bytes / m.read_bpus);
  }
  // A rank's own work, where ranks share CPUs (messages and flags are timed so already).
  double crowded(double us) const { return us * std::max(m.crowding, 1.0); }
  static constexpr double direct_unit_bytes = 256 * 1024;  // direct.cpp's read unit
};

Candidate usable(std::string name, double us) {
  return Candidate{std::move(name), true, us, {}};
}

Candidate refused(std::string name, std::string why) {
  return Candidate{std::move(name), false, 0, std::move(why)};
}

// A same-host algorithm through the shared slots, or why it cannot run here.
Candidate shared(const Topology& t, std::size_t payload, double us) {
  if (!t.shares_memory)
    return refused("shared", "needs every rank on one host with the shm transport");
  if (payload > t.shared_limit)
    return refused("shared", std::to_string(payload) + " B > a shared slot's " +
                                 std::to_string(t.shared_limit) + " B");
  return usable("shared", us);
}

// A same-host algorithm reading (and writing) the peers' buffers, or why it cannot run here.
Candidate direct(const Topology& t, double us) {
  return t.reads_peers ? usable("direct", us)
                       : refused("direct", "needs every rank on one host with cross-memory attach");
}

// Ranks that are not a power of two: the first 2 * extra ranks fold into their partners first
// and get the result back last (MPICH's scheme), one full message each way.
double fold_cost(const Terms& c, int p, double n) {
  return p == floor_pow2(p) ? 0 : 2 * c.send(n) + c.reduce(n);
}

// The model of the links inside a host, where it was measured apart.
CostModel within_host(CostModel m) {
  if (m.local_alpha_us > 0) m.alpha_us = m.local_alpha_us;
  if (m.local_link_bpus > 0) m.link_bpus = m.local_link_bpus;
  return m;
}

}  // namespace

Candidate flat_step(std::string_view collective, const Topology& t, const CostModel& model,
                    std::size_t bytes, int ranks, bool inside_host) {
  Topology flat = t;
  flat.ranks = ranks;
  flat.hosts = 1;
  flat.largest_host = 1;
  flat.shares_memory = flat.reads_peers = false;
  flat.in_place = true;
  const auto list = candidates(collective, bytes, flat, inside_host ? within_host(model) : model);
  const int best = cheapest(list);
  if (best >= 0) return list[static_cast<std::size_t>(best)];
  return {collective == "allreduce" ? "recursive_doubling" : "binomial", true, 0, {}};
}

namespace {

// Why the hierarchical form of a collective cannot run on `t`, or empty.
std::string hierarchical_refusal(const Topology& t) {
  if (t.hosts <= 1) return "needs ranks on several hosts";
  if (t.largest_host <= 1) return "one rank per host: the flat algorithms do the same";
  return {};
}

// The steps of a hierarchical collective: its flat form among one rank per host (over the
// network) and inside the most crowded host (over its own links), each the best of its
// candidates.
Candidate hierarchical(std::string_view collective, const Topology& t, const CostModel& m,
                       std::size_t bytes) {
  if (const auto why = hierarchical_refusal(t); !why.empty()) return refused("hierarchical", why);
  return usable("hierarchical",
                flat_step(collective, t, m, bytes, t.hosts, false).predicted_us +
                    flat_step(collective, t, m, bytes, t.largest_host, true).predicted_us);
}

// Reduce to each host's leader, allreduce among the leaders (the best flat algorithm for
// them), broadcast from each leader; the steps inside a host over its own links.
Candidate hierarchical_allreduce(const Topology& t, const Terms& c, std::size_t bytes) {
  if (const auto why = hierarchical_refusal(t); !why.empty()) return refused("hierarchical", why);
  const double n = static_cast<double>(bytes);
  const Terms inside{within_host(c.m), c.eager_bytes};
  const int steps = ceil_log2(t.largest_host);  // binomial reduce, then binomial broadcast
  const double within = steps * (inside.send(n) + inside.reduce(n)) + steps * inside.send(n);
  const double between = flat_step("allreduce", t, c.m, bytes, t.hosts, false).predicted_us;
  return usable("hierarchical", (t.in_place ? 0 : c.copy(n)) + within + between);
}

std::vector<Candidate> allreduce(const Topology& t, const Terms& c, std::size_t bytes) {
  const int p = t.ranks;
  const double n = static_cast<double>(bytes);
  const int pof2 = floor_pow2(p);
  const int rounds = ceil_log2(pof2);
  // Recursive doubling works in the receive buffer: out of place, it copies the input there
  // first. Rabenseifner and the ring reduce from the send buffer into the receive one, and
  // the same-host ones read the send buffers directly.
  const double input_copy = t.in_place ? 0 : c.copy(n);
  std::vector<Candidate> out;
  // Publish (a copy), one flag round, then every rank reduces all p contributions itself.
  // Larger, in stages of a part of the slot per rank: each rank copies its input
  // for the others in, reduces its segment, copies the result in and the others' out.
  const double seg = n / p;
  if (bytes <= t.shared_whole) {
    out.push_back(shared(t, bytes, c.m.flag_us + c.copy(n) + (p - 1) * c.reduce(n)));
  } else {
    const double part = static_cast<double>(t.shared_limit / static_cast<std::size_t>(p) / 64 * 64);
    const double stages = part > 0 ? std::ceil(seg / part) : 0;
    out.push_back(
        shared(t, static_cast<std::size_t>(p) * 64,
               (stages + 1) * c.m.flag_us + c.copy(2 * n - seg) + (p - 1) * c.reduce(seg)));
  }
  // Postings, words and "done" (three rounds of small messages); each rank reads p-1 segments
  // of n/p to reduce its own, then writes its reduced segment into the p-1 peers.
  out.push_back(
      direct(t, 3 * c.m.alpha_us + 2 * (p - 1) * c.peer_copy(seg) + (p - 1) * c.reduce(seg)));
  out.push_back(usable("recursive_doubling",
                       input_copy + rounds * (c.send(n) + c.reduce(n)) + fold_cost(c, p, n)));
  const double share = static_cast<double>(pof2 - 1) / pof2;
  // Each halving step sends half the window of the step before; the allgather the same sizes.
  out.push_back(usable("rabenseifner", 2 * c.halving_alphas(n, rounds) +
                                           2 * share * n / c.m.link_bpus + share * c.reduce(n) +
                                           fold_cost(c, p, n)));
  out.push_back(hierarchical_allreduce(t, c, bytes));
  if (bytes / std::max<std::size_t>(t.element_bytes, 1) < static_cast<std::size_t>(p)) {
    out.push_back(refused("ring", "fewer elements than ranks"));
  } else {
    // Reduce-scatter steps send their segment in chunks (one alpha each, overlapped with the
    // reduction of the previous chunk); allgather steps send one message each.
    const double ring_share = static_cast<double>(p - 1) / p;
    out.push_back(usable("ring", (p - 1) * (c.chunked_alphas(seg, t.chunk_bytes) + c.alpha(seg)) +
                                     2 * ring_share * n / c.m.link_bpus +
                                     ring_share * c.reduce(n)));
  }
  return out;
}

std::vector<Candidate> broadcast(const Topology& t, const Terms& c, std::size_t bytes) {
  const int p = t.ranks;
  const double n = static_cast<double>(bytes);
  std::vector<Candidate> out;
  // The root copies in, every other rank copies out, after one flag round.
  out.push_back(shared(t, bytes, c.m.flag_us + 2 * c.copy(n)));
  out.push_back(usable("binomial", ceil_log2(p) * c.send(n)));
  // A chain of p ranks passing k chunks: the last chunk leaves the root after k sends and
  // needs p - 1 hops; the hops of different chunks overlap.
  const double k =
      std::max(1.0, std::ceil(n / static_cast<double>(std::max<std::size_t>(t.chunk_bytes, 1))));
  out.push_back(usable("chain", (p - 2 + k) * c.send(n / k)));
  out.push_back(hierarchical("broadcast", t, c.m, bytes));
  return out;
}

std::vector<Candidate> allgather(const Topology& t, const Terms& c, std::size_t bytes) {
  const int p = t.ranks;
  const double n = static_cast<double>(bytes);
  const double block = n / p;
  std::vector<Candidate> out;
  out.push_back(shared(t, bytes / static_cast<std::size_t>(p), c.m.flag_us + c.copy(n)));
  out.push_back(usable("ring", (p - 1) * c.send(block)));
  // log2(p) messages carrying p-1 blocks in all, plus rotating the result into place.
  out.push_back(
      usable("bruck", ceil_log2(p) * c.m.alpha_us + (p - 1) * block / c.m.link_bpus + c.copy(n)));
  // Gather at each host's leader (its link takes the host's blocks one after another), a ring
  // of the leaders passing one host's blocks per step, then a broadcast inside each host.
  if (const auto why = hierarchical_refusal(t); !why.empty()) {
    out.push_back(refused("hierarchical", why));
  } else {
    const double host_share = n / t.hosts;
    const Candidate spread = flat_step("broadcast", t, c.m, bytes, t.largest_host, true);
    const double gather = c.m.local_alpha_us + (t.largest_host - 1) * block /
                                                   std::max(c.m.local_link_bpus, c.m.link_bpus);
    out.push_back(
        usable("hierarchical", gather + (t.hosts - 1) * c.send(host_share) + spread.predicted_us));
  }
  return out;
}

}  // namespace

std::vector<Candidate> candidates(std::string_view collective, std::size_t bytes, const Topology& t,
                                  const CostModel& model) {
  const Terms c{model, static_cast<double>(t.eager_bytes)};
  const int p = std::max(t.ranks, 1);
  const double n = static_cast<double>(bytes);
  if (collective == "allreduce") return allreduce(t, c, bytes);
  if (collective == "broadcast") return broadcast(t, c, bytes);
  if (collective == "allgather") return allgather(t, c, bytes);
  if (collective == "reduce") {
    return {shared(t, bytes, c.m.flag_us + c.copy(n) + (p - 1) * c.reduce(n)),
            usable("binomial", ceil_log2(p) * (c.send(n) + c.reduce(n))),
            hierarchical("reduce", t, model, bytes)};
  }
  if (collective == "barrier")
    return {shared(t, 0, c.m.flag_us), usable("dissemination", ceil_log2(p) * c.m.alpha_us)};
  // `bytes` is the whole buffer, n/p per rank and step. Direct: postings, words and done, then
  // each rank reads its block from the p-1 peers and reduces it.
  if (collective == "reduce_scatter") {
    // Both reduce from the send buffer into a work buffer (no copy of it first); the ring's
    // last step reduces into the receive buffer, halving copies this rank's block out.
    // Halving: log2(pof2) messages of half the window each, (pof2-1)/pof2 of the buffer in
    // all, after the fold of the extra ranks (the whole buffer) and before handing their
    // blocks back.
    const int pof2 = floor_pow2(p);
    const double share = static_cast<double>(pof2 - 1) / pof2;
    const double fold = pof2 == p ? 0 : c.send(n) + c.reduce(n) + c.send(n / p);
    // The ring's steps send their block in chunks, one message each (as allreduce's ring).
    const double seg = n / p;
    return {usable("ring", (p - 1) * (c.chunked_alphas(seg, t.chunk_bytes) + seg / c.m.link_bpus +
                                      c.reduce(seg))),
            usable("recursive_halving", fold + c.halving_alphas(n, ceil_log2(pof2)) +
                                            share * n / c.m.link_bpus + share * c.reduce(n) +
                                            c.copy(n / p)),
            direct(t, 3 * c.m.alpha_us + (p - 1) * (c.peer_copy(n / p) + c.reduce(n / p)))};
  }
  if (collective == "alltoall") {
    // Bruck: log2(p) rounds of about half the data, each packed and unpacked, plus the
    // rotations before and after.
    return {usable("pairwise", (p - 1) * c.send(n / p)),
            usable("bruck", ceil_log2(p) * (c.send(n / 2) + c.copy(n)) + 2 * c.copy(n))};
  }
  // One algorithm each so far: the root's link carries the p-1 blocks one after another.
  if (collective == "gather" || collective == "scatter")
    return {usable("linear", c.m.alpha_us + (p - 1) * n / p / c.m.link_bpus)};
  return {};
}

int cheapest(const std::vector<Candidate>& list) {
  int best = -1;
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (!list[i].usable) continue;
    if (best < 0 || list[i].predicted_us < list[static_cast<std::size_t>(best)].predicted_us)
      best = static_cast<int>(i);
  }
  return best;
}

std::string describe(const CostModel& m) {
  char line[160];
  std::snprintf(line, sizeof line, "alpha %.2f us, link %.2f GB/s", m.alpha_us, m.link_bpus / 1e3);
  std::string text = line;
  if (m.read_bpus > 0) {
    std::snprintf(line, sizeof line, ", peer read %.2f GB/s + %.2f us a call", m.read_bpus / 1e3,
                  m.read_us);
    text += line;
  }
  std::snprintf(line, sizeof line, ", reduce %.2f GB/s, copy %.2f GB/s", m.reduce_bpus / 1e3,
                m.copy_bpus / 1e3);
  text += line;
  if (m.flag_us > 0) {
    std::snprintf(line, sizeof line, ", shared flag %.2f us", m.flag_us);
    text += line;
  }
  if (m.crowding > 1) {
    std::snprintf(line, sizeof line, ", %.1f ranks per CPU", m.crowding);
    text += line;
  }
  if (m.local_alpha_us > 0) {
    std::snprintf(line, sizeof line, ", inside a host: alpha %.2f us, link %.2f GB/s",
                  m.local_alpha_us, m.local_link_bpus / 1e3);
    text += line;
  }
  return text + " (" + m.source + ")";
}

}  // namespace anview::collectives
