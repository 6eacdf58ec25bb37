// TLS end to end (ANVIEW_TLS=1), with the built anview-run and anview-perf: a job runs
// encrypted with the key from its secret or with certificates, and a rank whose TLS differs
// (none, another secret, a certificate of another CA) is refused with an error that says why,
// within seconds.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <tuple>

#include "job_test.hpp"
#include "support/test_certs.hpp"

namespace {

namespace fs = std::filesystem;

class TlsTest : public anview::testing::JobTest {
 protected:
  // A job of `script` with ANVIEW_TLS=1 and info logs (they say what is encrypted).
  Result run_tls(const std::string& script, const std::string& env = "") const {
    return run_job(script, "ANVIEW_TLS=1 ANVIEW_LOG_LEVEL=info " + env);
  }
  static void expect_refused(const Result& r, const std::string& why) {
    EXPECT_NE(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("error on rank 1"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(why), std::string::npos) << r.out;
    EXPECT_LT(r.seconds, 20) << "refused only after " << r.seconds << " s:\n" << r.out;
  }
};

TEST_F(TlsTest, AJobRunsEncryptedWithTheKeyOfItsSecret) {
  const Result r = run_tls(perf());
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("pingpong"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("store server on 127.0.0.1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("every connection is encrypted: TLS 1.3, a pre-shared key derived from "
                       "the job secret"),
            std::string::npos)
      << r.out;
}

TEST_F(TlsTest, ARankWithoutTlsIsToldTheStoreRequiresIt) {
  expect_refused(run_tls("if [ \"$ANVIEW_RANK\" = 1 ]; then export ANVIEW_TLS=0; fi; " + perf()),
                 "this store requires TLS");
}

TEST_F(TlsTest, ARankWithTlsAmongPlainOnesIsToldWhy) {
  expect_refused(run_job("if [ \"$ANVIEW_RANK\" = 1 ]; then export ANVIEW_TLS=1; fi; " + perf()),
                 "does it have ANVIEW_TLS=1");
}

TEST_F(TlsTest, ARankWithAnotherSecretCannotEvenStartTls) {
  const Result r =
      run_tls("if [ \"$ANVIEW_RANK\" = 1 ]; then export ANVIEW_SECRET=wrong; fi; " + perf());
  expect_refused(r, "TLS with the store");
  EXPECT_NE(r.out.find("the client's key comes from another job secret"), std::string::npos)
      << r.out;
}

TEST_F(TlsTest, TlsWithNeitherSecretNorCertificatesIsAUsageError) {
  const Result r = run_tls("unset ANVIEW_SECRET; " + perf());
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("usage error"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ANVIEW_TLS=1 needs certificates"), std::string::npos) << r.out;
}

TEST_F(TlsTest, CertificatesOfTheJobsCaWorkAndAnotherCasAreRefused) {
  const anview::testing::TestPki pki(dir_);
  const auto& [a, b, r] = std::tie(pki.first, pki.second, pki.foreign);
  const std::string& ca_file = pki.ca_file;
  // Each rank its own certificate; rank 1 takes `second`.
  const auto job = [&](const anview::testing::TestCa::Leaf& second) {
    return "if [ \"$ANVIEW_RANK\" = 1 ]; then export ANVIEW_TLS_CERT='" + second.cert +
           "' ANVIEW_TLS_KEY='" + second.key + "'; else export ANVIEW_TLS_CERT='" + a.cert +
           "' ANVIEW_TLS_KEY='" + a.key + "'; fi; " + perf();
  };
  const Result ok = run_tls(job(b), "ANVIEW_TLS_CA='" + ca_file + "'");
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
  EXPECT_NE(ok.out.find("TLS 1.3, certificates signed by the CA in " + ca_file), std::string::npos)
      << ok.out;
  const Result refused = run_tls(job(r), "ANVIEW_TLS_CA='" + ca_file + "'");
  expect_refused(refused, "certificate is not accepted");
}

}  // namespace
