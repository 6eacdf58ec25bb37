// The hang doctor's report from the ranks' notes (the multi-process test stops a real rank).
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "core/hang_doctor.hpp"

namespace anview::detail {
namespace {

using namespace std::chrono_literals;

TEST(HangDoctor, NamesTheRanksInTheCallAndTheOnesNotInIt) {
  const std::string op = "allreduce #57";
  const std::vector<std::string> notes = {
      HangDoctor::note(op, 10s, 3, "no matching message from rank 3 has arrived"),
      HangDoctor::note(op, 9500ms, 0, "no matching message from rank 0 has arrived"),
      HangDoctor::note(op, 10s, 3, "rank 3 has not reached the call"),
      "",
  };
  const std::string report = HangDoctor::diagnose(op, 0, notes);
  EXPECT_EQ(report,
            "hang doctor: allreduce #57 has waited 10.0 s on rank 0, for rank 3 (no matching "
            "message from rank 3 has arrived). In allreduce #57 and waiting: ranks 0, 1, 2. Not in "
            "it: rank 3 (it has not reached allreduce #57, or is stopped or busy outside Anview).");
}

TEST(HangDoctor, RanksInAnotherCallAreAnOrderMismatch) {
  const std::vector<std::string> notes = {
      HangDoctor::note("allreduce #8", 2s, 1, "no matching message from rank 1 has arrived"),
      HangDoctor::note("broadcast #8", 2s, 0, "no matching message from rank 0 has arrived"),
  };
  const std::string report = HangDoctor::diagnose("allreduce #8", 0, notes);
  EXPECT_NE(report.find("In allreduce #8 and waiting: rank 0."), std::string::npos) << report;
  EXPECT_NE(report.find("rank 1 waits in broadcast #8 for rank 0"), std::string::npos) << report;
  EXPECT_NE(report.find("disagree on the order of calls"), std::string::npos) << report;
  EXPECT_EQ(report.find("Not in it"), std::string::npos) << report;
}

TEST(HangDoctor, SeveralAbsentRanks) {
  const std::vector<std::string> notes = {"", HangDoctor::note("barrier #2", 1s, -1, "x"), ""};
  const std::string report = HangDoctor::diagnose("barrier #2", 1, notes);
  EXPECT_NE(report.find("has waited 1.0 s on rank 1 (x)."), std::string::npos) << report;
  EXPECT_NE(report.find("Not in it: ranks 0, 2 (they have not reached barrier #2, or are "
                        "stopped or busy outside Anview)."),
            std::string::npos)
      << report;
}

}  // namespace
}  // namespace anview::detail
