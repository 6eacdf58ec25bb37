// The job secret end to end, with the built anview-run (ANVIEW_RUN_PATH) and anview-perf
// (ANVIEW_PERF_PATH): every job gets a fresh secret, a rank with another secret (or none) is
// refused with an `auth` error that says why, within seconds, and a secret file works.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "job_test.hpp"

namespace {

namespace fs = std::filesystem;

using AuthTest = anview::testing::JobTest;

TEST_F(AuthTest, EveryJobGetsAFreshSecretAndAGivenOneIsKept) {
  const Result a = run_job("echo \"secret=$ANVIEW_SECRET\"");
  const Result b = run_job("echo \"secret=$ANVIEW_SECRET\"");
  ASSERT_EQ(a.exit_code, 0) << a.out;
  const auto first = a.out.find("secret=");
  ASSERT_NE(first, std::string::npos) << a.out;
  const std::string secret = a.out.substr(first + 7, 64);
  EXPECT_EQ(secret.find_first_not_of("0123456789abcdef"), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("secret=" + secret, first + 1), std::string::npos)
      << "the two ranks got different secrets:\n"
      << a.out;
  EXPECT_EQ(b.out.find(secret), std::string::npos) << "two jobs got the same secret";
  const Result given = run_job("echo \"secret=$ANVIEW_SECRET\"", "ANVIEW_SECRET=mine");
  EXPECT_NE(given.out.find("secret=mine\n"), std::string::npos) << given.out;
}

TEST_F(AuthTest, AJobWithItsSecretRuns) {
  const Result r = run_job(perf());
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("pingpong"), std::string::npos) << r.out;
}

TEST_F(AuthTest, ARankWithAnotherSecretIsRefusedByName) {
  const Result r =
      run_job("if [ \"$ANVIEW_RANK\" = 1 ]; then export ANVIEW_SECRET=wrong; fi; " + perf());
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("auth error on rank 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("did not prove the job secret"), std::string::npos) << r.out;
  EXPECT_LT(r.seconds, 20) << "refused only after " << r.seconds << " s:\n" << r.out;
}

TEST_F(AuthTest, ARankWithoutTheSecretIsRefusedByName) {
  const Result r = run_job("if [ \"$ANVIEW_RANK\" = 1 ]; then unset ANVIEW_SECRET; fi; " + perf());
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("auth error on rank 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("requires the job secret"), std::string::npos) << r.out;
  EXPECT_LT(r.seconds, 20) << "refused only after " << r.seconds << " s:\n" << r.out;
}

TEST_F(AuthTest, ASecretFileWorksOnlyWhenPrivate) {
  const fs::path file = dir_ / "secret";
  std::ofstream(file) << "from-a-file\n";
  ::chmod(file.c_str(), 0600);
  const Result ok = run_job(perf(), "ANVIEW_SECRET_FILE='" + file.string() + "'");
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
  ::chmod(file.c_str(), 0644);
  const Result refused = run_job(perf(), "ANVIEW_SECRET_FILE='" + file.string() + "'");
  EXPECT_NE(refused.exit_code, 0) << refused.out;
  EXPECT_NE(refused.out.find("chmod 600"), std::string::npos) << refused.out;
}

}  // namespace
