// A test fixture that runs a 2-rank job under the built anview-run (ANVIEW_RUN_PATH) with
// anview-perf (ANVIEW_PERF_PATH) in a fresh temporary directory, with no secret from the
// test's own environment: the security tests (auth_test, tls_test) share it.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace anview::testing {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

inline std::string read(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class JobTest : public ::testing::Test {
 protected:
  struct Result {
    int exit_code = -1;
    std::string out;  // stdout and stderr together
    double seconds = 0;
  };

  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "anview-job-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // `script` (sh) on 2 ranks under anview-run; `env` ("NAME=value ...") goes before it.
  Result run_job(const std::string& script, const std::string& env = "") const {
    const fs::path out = dir_ / "output";
    const std::string command = "timeout 60 env -u ANVIEW_SECRET -u ANVIEW_SECRET_FILE " +
                                std::string("ANVIEW_TRANSPORTS=tcp ANVIEW_TIMEOUT=20 ") + env +
                                " '" + ANVIEW_RUN_PATH + "' -n 2 --timeout 40 --grace 1 sh -c '" +
                                script + "' </dev/null >'" + out.string() + "' 2>&1";
    const auto start = Clock::now();
    const int status = std::system(command.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read(out),
            std::chrono::duration<double>(Clock::now() - start).count()};
  }

  static std::string perf() {
    return std::string("exec \"") + ANVIEW_PERF_PATH + "\" pingpong -b 8 -e 64 -f 8 -n 10 -w 1";
  }

  fs::path dir_;
};

}  // namespace anview::testing
