// How a collective call gets its algorithm: ANVIEW_ALGO, or the tuner's pick from the cost
// model (cost_model.hpp) with the costs the job measured (tuning.hpp); and the reports of it
// (collective_algorithm, anview-info --explain).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "base/config.hpp"
#include "collectives/collectives.hpp"  // the members defined here
#include "collectives/tuning.hpp"

namespace anview::collectives {
namespace {

const base::Setting algo_setting(
    "collectives", "ANVIEW_ALGO", "",
    "Forces algorithms, as collective=algorithm items separated by commas: allreduce=ring, "
    "recursive_doubling, rabenseifner, hierarchical, direct or shared; broadcast=binomial, "
    "chain, hierarchical or shared; allgather=ring, bruck, hierarchical or shared; "
    "alltoall=pairwise or bruck; reduce=binomial, hierarchical or shared; reduce_scatter=ring, "
    "recursive_halving or direct; barrier=dissemination or shared "
    "(default: the tuner's pick, "
    "see anview-info --explain)");

// Costs to predict with before the job has measured its own (reports only: every call that
// chooses measures first). Loopback-TCP-like, so nothing looks better than it will be.
CostModel assumed_costs() {
  return {.alpha_us = 10,
          .link_bpus = 1500,
          .reduce_bpus = 5000,
          .copy_bpus = 5000,
          .flag_us = 1,
          .source =
              "assumed: the job measures its own at its first collective that has a "
              "choice"};
}

std::string microseconds(double us) {
  char text[32];
  std::snprintf(text, sizeof text, us < 10 ? "%.2f" : us < 1000 ? "%.1f" : "%.0f", us);
  return text;
}

}  // namespace

std::vector<Collectives::Forced> Collectives::read_forced() {
  std::vector<Forced> forced;
  for (const auto& item : algo_setting.as_list()) {
    const auto eq = item.find('=');
    if (eq == std::string::npos) continue;
    Forced f{.collective = item.substr(0, eq), .algorithm = item.substr(eq + 1)};
    f.recorded = FlightRecorder::stable_name(f.algorithm);
    const auto list = candidates(f.collective, 0, Topology{}, assumed_costs());
    for (const auto& c : list) f.names += (f.names.empty() ? "" : ", ") + c.algorithm;
    f.known = list.empty() || std::any_of(list.begin(), list.end(), [&](const Candidate& c) {
                return c.algorithm == f.algorithm;
              });
    forced.push_back(std::move(f));
  }
  return forced;
}

const Collectives::Forced* Collectives::forced_for(std::string_view collective) const {
  for (const auto& f : forced_)
    if (f.collective == collective) return f.algorithm.empty() ? nullptr : &f;
  return nullptr;
}

void Collectives::check_forced_known(const Call& call) const {
  for (const auto& f : forced_) {
    if (f.collective == call.name && !f.known)
      usage(call, "ANVIEW_ALGO names " + f.collective + "=" + f.algorithm + "; known: " + f.names);
  }
}

void Collectives::check_runs(const Call& call, const std::string& algo, std::size_t bytes) const {
  if ((algo == "direct" && !placement_allows(reads_peers)) ||
      (algo == "shared" && !placement_allows(shares_memory))) {
    usage(call, "ANVIEW_ALGO forces " + std::string(call.name) + "=" + algo +
                    ", but not every rank can use it (it needs all ranks on one host with the shm "
                    "transport" +
                    (algo == "direct" ? std::string(" and cross-memory attach") : "") +
                    "; anview-info tells why not)");
  }
  if (algo == "hierarchical" && topology(1).hosts <= 1) {
    usage(call, "ANVIEW_ALGO forces " + std::string(call.name) +
                    "=hierarchical, but every rank is on one host (anview-info --peers shows "
                    "the hosts)");
  }
  if (algo == "shared" && bytes > shared_slot_payload) {
    usage(call, std::string(call.name) + "=shared holds at most " +
                    std::to_string(shared_slot_payload) + " bytes per rank, not " +
                    std::to_string(bytes));
  }
}

Topology Collectives::topology(std::size_t element_bytes) const {
  const bool agreed = agreed_placement_.load(std::memory_order_acquire) >= 0;
  return {.ranks = messenger_.size(),
          .hosts = agreed ? static_cast<int>(layout_.hosts.size()) : 1,
          .largest_host = agreed ? layout_.largest : messenger_.size(),
          .shares_memory = placement_allows(shares_memory),
          .reads_peers = placement_allows(reads_peers),
          .shared_limit = shared_slot_payload,
          .shared_whole = shared_whole_bytes,
          .chunk_bytes = chunk_bytes_,
          .eager_bytes = messenger_.eager_bytes(),
          .element_bytes = element_bytes};
}

CostModel Collectives::current_model() const {
  std::lock_guard lock(model_mu_);
  return model_ ? *model_ : assumed_costs();
}

void Collectives::measure_costs() {
  if (model_) return;  // only this thread writes it
  const int bits = placement();
  Call call = begin("tuning probe");
  CostModel measured;
  run_guarded(call, [&] {
    const Placement where{.bits = bits,
                          .areas = (bits & shares_memory) != 0 ? &shared_areas_ : nullptr,
                          .peers = (bits & reads_peers) != 0 ? &peer_memories_ : nullptr,
                          .layout = &layout_};
    measured = tune(call, where, shared_calls_);
  });
  std::lock_guard lock(model_mu_);
  model_ = measured;
  decisions_.fill({});  // picks made with the assumed costs
}

const std::string& Collectives::choose_anew(const Call& call, std::string_view collective,
                                            std::size_t bytes, std::size_t element_bytes,
                                            std::size_t per_rank) {
  placement();
  if (const Forced* f = forced_for(collective)) {
    check_runs(call, f->algorithm, per_rank);
    call.record.algorithm(f->recorded);
    return f->algorithm;
  }
  if (model_) {  // measured: a pick depends on the arguments alone (this thread writes model_)
    if (const Decision* d = recall(collective, Step::whole, bytes, element_bytes)) {
      call.record.algorithm(d->recorded);
      return d->algorithm;
    }
  } else {
    int choices = 0;
    for (const auto& c : candidates(collective, bytes, topology(element_bytes), assumed_costs()))
      choices += c.usable ? 1 : 0;
    if (choices > 1) measure_costs();
  }
  const std::string& algorithm =
      remember({.collective = std::string(collective),
                .name_seen = collective.data(),
                .bytes = bytes,
                .element_bytes = element_bytes,
                .algorithm = pick(collective, bytes, element_bytes, nullptr)});
  call.record.algorithm(decisions_[last_decision_].recorded);
  return algorithm;
}

const Collectives::Decision* Collectives::recall(std::string_view collective, Step step,
                                                 std::size_t bytes,
                                                 std::size_t element_bytes) const {
  // The numbers first: "allreduce" and "broadcast" have the same length, so telling them apart
  // by name takes a memcmp. The last pick first: programs repeat a call.
  const auto same = [&](const Decision& d) {
    return d.same_numbers(step, bytes, element_bytes) &&
           (d.name_seen == collective.data() || d.collective == collective);
  };
  if (same(decisions_[last_decision_])) return &decisions_[last_decision_];
  for (std::size_t i = 0; i < decisions_.size(); ++i) {
    if (same(decisions_[i])) {
      last_decision_ = i;
      return &decisions_[i];
    }
  }
  return nullptr;
}

const std::string& Collectives::remember(Decision decision) {
  last_decision_ = next_decision_++ % decisions_.size();
  Decision& d = decisions_[last_decision_];
  d = std::move(decision);
  d.recorded = FlightRecorder::stable_name(d.algorithm);
  return d.algorithm;
}

const std::string& Collectives::step_algorithm(std::string_view collective, std::size_t bytes,
                                               std::size_t element_bytes, bool inside_host) {
  const Step step = inside_host ? Step::inside_host : Step::among_hosts;
  if (const Decision* d = recall(collective, step, bytes, element_bytes)) return d->algorithm;
  const Topology t = topology(element_bytes);
  return remember({.collective = std::string(collective),
                   .name_seen = collective.data(),
                   .step = step,
                   .bytes = bytes,
                   .element_bytes = element_bytes,
                   .algorithm = flat_step(collective, t, current_model(), bytes,
                                          inside_host ? t.largest_host : t.hosts, inside_host)
                                    .algorithm});
}

std::string Collectives::pick(std::string_view collective, std::size_t bytes,
                              std::size_t element_bytes, std::string* why) const {
  if (const Forced* f = forced_for(collective)) {
    if (why) *why = "forced by ANVIEW_ALGO";
    return f->algorithm;
  }
  const CostModel model = current_model();
  const auto list = candidates(collective, bytes, topology(element_bytes), model);
  const int best = cheapest(list);
  if (best < 0) return {};
  const Candidate& chosen = list[static_cast<std::size_t>(best)];
  if (why) {
    *why = "predicted " + microseconds(chosen.predicted_us) + " us";
    for (const auto& c : list) {
      if (&c == &chosen) continue;
      *why += c.usable ? "; " + c.algorithm + " " + microseconds(c.predicted_us) + " us"
                       : "; " + c.algorithm + " cannot run: " + c.why_not;
    }
    *why += " (costs " + model.source + ")";
  }
  return chosen.algorithm;
}

std::string Collectives::explain(std::string_view collective, std::size_t bytes) {
  const int n = messenger_.size();
  if (candidates(collective, bytes, topology(4), assumed_costs()).empty()) return {};
  if (n > 1) measure_costs();  // agrees on the placement first
  const CostModel model = current_model();
  const Topology t = topology(4);
  const auto list = candidates(collective, bytes, t, model);
  const int best = cheapest(list);
  const Forced* f = forced_for(collective);
  const std::string forced = f != nullptr ? f->algorithm : std::string();
  std::string text = std::string(collective) + " of " + std::to_string(bytes) +
                     " bytes (float32) on " + std::to_string(n) + " rank" + (n == 1 ? "" : "s") +
                     ": ";
  if (t.shares_memory || t.reads_peers) {
    text += "one host (";
    text += t.shares_memory ? "shared memory" : "";
    text += t.shares_memory && t.reads_peers ? ", " : "";
    text += t.reads_peers ? "cross-memory attach" : "";
    text += ")\n";
  } else if (t.hosts > 1) {
    text += std::to_string(t.hosts) + " hosts, up to " + std::to_string(t.largest_host) +
            " ranks on one: messages only between hosts\n";
  } else {
    text += n == 1 ? "nothing to move\n" : "messages only (no shm transport between some ranks)\n";
  }
  text += "costs: " + describe(model) + "\n";
  char row[160];
  std::snprintf(row, sizeof row, "  %-20s %14s\n", "algorithm", "predicted_us");
  text += row;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const Candidate& c = list[i];
    std::string note;
    if (!c.usable) note = "cannot run: " + c.why_not;
    if (static_cast<int>(i) == best) note = forced.empty() ? "<- pick" : "(fastest predicted)";
    if (c.algorithm == forced)
      note += std::string(note.empty() ? "" : " ") + "<- forced by ANVIEW_ALGO";
    std::snprintf(row, sizeof row, "  %-20s %14s  ", c.algorithm.c_str(),
                  c.usable ? microseconds(c.predicted_us).c_str() : "-");
    std::string line = row + note;
    line.erase(line.find_last_not_of(' ') + 1);
    text += line + "\n";
  }
  return text;
}

std::string Collectives::algorithm(std::string_view collective, std::size_t bytes,
                                   std::string* why) const {
  return pick(collective, bytes, size_of(DataType::float32), why);
}

}  // namespace anview::collectives
