// The hang doctor: when a collective step has waited past ANVIEW_WATCHDOG, the rank writes what
// it waits in and for to the communicator's store, reads what the other ranks wrote, and logs
// one report naming the ranks that are in the call and the ones that are not, e.g.
//
//   hang doctor: allreduce #57 has waited 10.0 s on rank 0, for rank 3 (no matching message
//   from rank 3 has arrived). In allreduce #57 and waiting: ranks 0, 1, 2. Not in it: rank 3
//   (it has not reached allreduce #57, or it is stopped or busy outside Anview).
//
// The store is a side channel that does not depend on the stuck path. Its calls take a short
// timeout of their own, so a store that does not answer (its server stopped) delays the
// waiting step by at most that, and the report says so.
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "anview/store.hpp"
#include "collectives/watchdog.hpp"

namespace anview::detail {

class HangDoctor final : public collectives::StallReporter {
 public:
  HangDoctor(Store store, std::string prefix, int rank, int size);

  void stalled(const collectives::Call& call, std::chrono::milliseconds waited, int peer,
               const std::string& waiting_for) noexcept override;
  void resumed(const collectives::Call& call) noexcept override;
  // The latest report (for the dumps); empty before the first. remember() keeps one made
  // elsewhere (a point-to-point wait's, logged by the messenger).
  std::string last_report() const;
  void remember(std::string report);

  // The report for `operation` on this rank, from the notes of every rank (one per rank, empty
  // where a rank wrote none). Exposed for tests.
  static std::string diagnose(const std::string& operation, int rank,
                              const std::vector<std::string>& notes);
  // A rank's note: what it waits in and for.
  static std::string note(const std::string& operation, std::chrono::milliseconds waited, int peer,
                          const std::string& waiting_for);

 private:
  std::string key(int rank) const;
  // Logs the report and keeps it for the dumps.
  void report(std::string text);

  Store store_;
  std::string prefix_;
  int rank_;
  int size_;
  mutable std::mutex mu_;
  std::string last_report_;
};

}  // namespace anview::detail
