#include "core/hang_doctor.hpp"

#include <sstream>
#include <utility>
#include <vector>

#include "base/log.hpp"
#include "collectives/algorithms.hpp"
#include "core/dump_service.hpp"

namespace anview::detail {
namespace {

// Each store exchange of a report waits at most this long.
constexpr auto store_timeout = std::chrono::seconds(2);

struct Note {
  std::string operation;  // "allreduce #57"
  std::string waited;     // "10.0 s"
  std::string waiting_for;
};

// A note is three lines: operation, time waited, what is missing.
Note parse(const std::string& text) {
  Note n;
  std::istringstream in(text);
  std::getline(in, n.operation);
  std::getline(in, n.waited);
  std::getline(in, n.waiting_for);
  return n;
}

std::string seconds(std::chrono::milliseconds ms) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(1);
  out << static_cast<double>(ms.count()) / 1000.0 << " s";
  return out.str();
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i)
    text += (i > 0 ? ", " : "") + std::to_string(ranks[i]);
  return text;
}

}  // namespace

HangDoctor::HangDoctor(Store store, std::string prefix, int rank, int size)
    : store_(std::move(store)), prefix_(std::move(prefix)), rank_(rank), size_(size) {}

std::string HangDoctor::key(int rank) const {
  return prefix_ + "/hang-doctor/" + std::to_string(rank);
}

std::string HangDoctor::note(const std::string& operation, std::chrono::milliseconds waited,
                             int peer, const std::string& waiting_for) {
  const std::string who = peer >= 0 ? "for rank " + std::to_string(peer) + " (" : "(";
  return operation + "\n" + seconds(waited) + "\n" + who + waiting_for + ")";
}

std::string HangDoctor::diagnose(const std::string& operation, int rank,
                                 const std::vector<std::string>& notes) {
  std::vector<int> in_it, absent;
  std::vector<std::string> elsewhere;
  for (std::size_t r = 0; r < notes.size(); ++r) {
    const int peer = static_cast<int>(r);
    if (notes[r].empty()) {
      absent.push_back(peer);
      continue;
    }
    const Note n = parse(notes[r]);
    if (n.operation == operation)
      in_it.push_back(peer);
    else
      elsewhere.push_back("rank " + std::to_string(peer) + " waits in " + n.operation + " " +
                          n.waiting_for);
  }
  const Note mine = parse(notes[static_cast<std::size_t>(rank)]);
  const bool for_rank = mine.waiting_for.rfind("for ", 0) == 0;
  std::string text = "hang doctor: " + operation + " has waited " + mine.waited + " on rank " +
                     std::to_string(rank) + (for_rank ? ", " : " ") + mine.waiting_for + ".";
  if (!in_it.empty()) text += " In " + operation + " and waiting: " + rank_list(in_it) + ".";
  for (const auto& e : elsewhere) text += " " + e + ": the ranks disagree on the order of calls.";
  if (!absent.empty())
    text += " Not in it: " + rank_list(absent) + " (" +
            (absent.size() == 1 ? "it has" : "they have") + " not reached " + operation + ", or " +
            (absent.size() == 1 ? "is" : "are") + " stopped or busy outside Anview).";
  return text;
}

void HangDoctor::stalled(const collectives::Call& call, std::chrono::milliseconds waited, int peer,
                         const std::string& waiting_for) noexcept {
  try {
    const std::string operation = call.operation();
    std::vector<std::string> notes(static_cast<std::size_t>(size_));
    notes[static_cast<std::size_t>(rank_)] = note(operation, waited, peer, waiting_for);
    store_.set(key(rank_), notes[static_cast<std::size_t>(rank_)], store_timeout);
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || !store_.check({key(r)}, store_timeout)) continue;
      notes[static_cast<std::size_t>(r)] = store_.get_string(key(r), store_timeout);
    }
    report(diagnose(operation, rank_, notes));
  } catch (const std::exception& e) {
    std::ostringstream text;
    text << "hang doctor: " << call.operation() << " has waited " << seconds(waited) << " on rank "
         << rank_ << (peer >= 0 ? ", for rank " + std::to_string(peer) : std::string()) << " ("
         << waiting_for << "); comparing notes with the other ranks failed: " << e.what();
    report(text.str());
  }
  DumpService::instance().write("hang doctor: " + call.operation() + " stalled");
}

void HangDoctor::report(std::string text) {
  base::log("doctor", base::LogLevel::warn, text);
  remember(std::move(text));
}

void HangDoctor::remember(std::string report) {
  std::lock_guard lock(mu_);
  last_report_ = std::move(report);
}

std::string HangDoctor::last_report() const {
  std::lock_guard lock(mu_);
  return last_report_;
}

void HangDoctor::resumed(const collectives::Call& call) noexcept {
  try {
    store_.set(key(rank_), std::string(), store_timeout);  // empty: not stalled
    base::log("doctor", base::LogLevel::warn, "hang doctor: ", call.operation(), " on rank ", rank_,
              " goes on");
  } catch (const std::exception&) {
    // The store is gone too; the next report will say so.
  }
}

}  // namespace anview::detail
