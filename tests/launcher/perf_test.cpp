// Runs the built anview-perf (ANVIEW_PERF_PATH) under anview-run (ANVIEW_RUN_PATH) and checks
// its --plot and its progress bar: --plot draws a PNG with gnuplot (skipped where gnuplot is not
// installed), and without gnuplot the results still come first, then a clear error; the
// progress bar shows on a terminal (a pty from `script`) only, never with --json, and stdout
// reads the same with it.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');)
    if (!dir.empty() && ::access((dir + "/" + program).c_str(), X_OK) == 0) return true;
  return false;
}

std::string read(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A fresh folder per test, removed after it.
class PerfTest : public ::testing::Test {
 protected:
  struct Result {
    int exit_code = -1;
    std::string out;
    std::string err;
  };

  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "anview-perf-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // anview-perf `args` on 2 ranks; `env` ("NAME=value ...") goes before the launcher.
  static std::string perf(const std::string& args, const std::string& env = "") {
    return "timeout 60 env ANVIEW_LOG_LEVEL=error ANVIEW_TIMEOUT=20 " + env + " '" +
           ANVIEW_RUN_PATH + "' -n 2 --timeout 40 '" + ANVIEW_PERF_PATH + "' " + args;
  }

  // Runs `command` with its stdout and stderr in files.
  Result run(const std::string& command) const {
    const fs::path out = dir_ / "stdout", err = dir_ / "stderr";
    const int status = std::system(
        (command + " <'/dev/null' >'" + out.string() + "' 2>'" + err.string() + "'").c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read(out), read(err)};
  }

  // Runs `command` on a pseudo-terminal; its stdout goes to a file, so Result::err is what the
  // terminal showed.
  Result run_on_terminal(const std::string& command) const {
    const fs::path out = dir_ / "stdout-beside-the-terminal";
    const Result shown = run("script -qec \"" + command + " >'" + out.string() + "'\" /dev/null");
    return {shown.exit_code, read(out), shown.out};
  }

  fs::path dir_;
};

constexpr char png_signature[] = "\x89PNG\r\n\x1a\n";

void expect_png(const fs::path& file) {
  const std::string png = read(file);
  ASSERT_GT(png.size(), 8u) << file << " is missing or empty";
  EXPECT_EQ(png.substr(0, 8), std::string(png_signature, 8)) << file << " is no PNG";
}

TEST_F(PerfTest, PlotOfACollectiveSweepIsAPng) {
  if (!on_path("gnuplot")) GTEST_SKIP() << "gnuplot not installed (apt-get install gnuplot-nox)";
  const fs::path png = dir_ / "allreduce.png";
  const Result r = run(perf("allreduce -b 8 -e 4K -f 8 -n 3 -w 1 --plot '" + png.string() + "'"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("# anview-perf allreduce"), std::string::npos) << r.out;
  EXPECT_EQ(r.err, "") << "no terminal: no progress bar, and gnuplot said nothing";
  expect_png(png);
}

TEST_F(PerfTest, PlotOfPingpongIsAPng) {
  if (!on_path("gnuplot")) GTEST_SKIP() << "gnuplot not installed (apt-get install gnuplot-nox)";
  const fs::path png = dir_ / "pingpong.png";
  const Result r = run(perf("pingpong -b 8 -e 4K -f 8 -n 10 -w 1 --plot '" + png.string() + "'"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  expect_png(png);
}

TEST_F(PerfTest, PlotWithoutGnuplotPrintsTheResultsThenFails) {
  const fs::path png = dir_ / "x.png";
  const Result r = run(perf("allreduce -b 8 -e 64 -f 8 -n 3 -w 1 --plot '" + png.string() + "'",
                            "PATH=" + (dir_ / "no-gnuplot-here").string()));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("# anview-perf allreduce"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n          64 "), std::string::npos) << "the last size:\n" << r.out;
  EXPECT_NE(r.err.find("--plot needs gnuplot (apt-get install gnuplot-nox): not found on PATH"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(png));
}

TEST_F(PerfTest, PlotIntoAMissingFolderFailsBeforeTheSweep) {
  const fs::path png = dir_ / "no" / "such" / "x.png";
  const Result r = run(perf("pingpong -e 64 -n 3 --plot '" + png.string() + "'"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("the folder " + png.parent_path().string() + " does not exist"),
            std::string::npos)
      << r.err;
}

TEST_F(PerfTest, ProgressBarOnATerminalOnly) {
  if (!on_path("script")) GTEST_SKIP() << "no `script` (util-linux) to run on a pseudo-terminal";
  const std::string sweep = perf("allreduce -b 8 -e 4K -f 8 -n 3 -w 1");
  const Result shown = run_on_terminal(sweep);
  ASSERT_EQ(shown.exit_code, 0) << shown.err;
  EXPECT_NE(shown.err.find("\rallreduce [>"), std::string::npos) << shown.err;
  EXPECT_NE(shown.err.find("] 4/4 sizes, 4 KiB"), std::string::npos) << shown.err;
  EXPECT_EQ(shown.err.substr(shown.err.size() - 4), "\r\033[K") << "erased at the end";
  // stdout is the same as without a terminal: no bar, no control characters.
  const Result plain = run(sweep);
  ASSERT_EQ(plain.exit_code, 0);
  EXPECT_EQ(plain.err, "") << "stderr is a file: no bar";
  EXPECT_EQ(shown.out.find('\r'), std::string::npos) << shown.out;
  EXPECT_EQ(shown.out.find("sizes"), std::string::npos) << shown.out;
  EXPECT_NE(shown.out.find("# anview-perf allreduce"), std::string::npos) << shown.out;
}

TEST_F(PerfTest, JsonShowsNoProgressBarEvenOnATerminal) {
  if (!on_path("script")) GTEST_SKIP() << "no `script` (util-linux) to run on a pseudo-terminal";
  const Result shown = run_on_terminal(perf("bw -b 8 -e 4K -f 8 -n 4 -w 1 --json"));
  ASSERT_EQ(shown.exit_code, 0) << shown.err;
  EXPECT_EQ(shown.err, "") << "nothing on the terminal but stdout";
  EXPECT_EQ(shown.out.front(), '{') << shown.out;
}

// Payloads in anview::HostBuffers (2 MiB pages) over shared memory, up to 4 MiB: past
// ANVIEW_SHM_SPLIT_BYTES, so both ranks copy parts of each large message with cross-memory
// attach, and across 2 MiB pages. Every payload is checked.
TEST_F(PerfTest, HugePageBuffersCarryCheckedPayloads) {
  for (const char* args :
       {"bw -b 4 -e 4M -f 32 -n 8 -w 1 --window 4", "pingpong -b 4 -e 4M -f 32 -n 4 -w 1",
        "allreduce -b 4 -e 4M -f 32 -n 3 -w 1"}) {
    const Result r = run(perf(std::string(args) + " --check --huge-pages --json"));
    ASSERT_EQ(r.exit_code, 0) << args << "\n" << r.out << r.err;
    std::vector<nlohmann::json> rows;
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);)
      if (!line.empty() && line.front() == '{') rows.push_back(nlohmann::json::parse(line));
    ASSERT_EQ(rows.size(), 5u) << args << "\n" << r.out;  // 4, 128, 4K, 128K, 4M
    EXPECT_EQ(rows.back()["bytes"], 4u << 20) << args;
    for (const auto& row : rows) {
      EXPECT_EQ(row["huge_pages"], true) << row;
      EXPECT_EQ(row["wrong"], 0) << row;
      EXPECT_EQ(row["transport"], "shm") << row;
    }
  }
  // rpc and pubsub have no payload buffers of their own: refused, not ignored.
  const Result refused = run(perf("rpc --huge-pages"));
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find("--huge-pages applies to"), std::string::npos) << refused.err;
}

}  // namespace
