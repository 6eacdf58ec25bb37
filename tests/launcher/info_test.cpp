// Runs the built anview-info (ANVIEW_INFO_PATH), alone and under anview-run (ANVIEW_RUN_PATH),
// and checks what it reports: every component's settings and where their values came from, the
// transports usable here and why one is not, and the per-peer transport plan (shm within a host,
// tcp across emulated hosts).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace {

using nlohmann::json;

struct Result {
  int exit_code = -1;
  std::string out;  // stdout; stderr goes to the test's log
};

// Runs `args` with a clean environment plus `env` ("NAME=value ..."), bounded by `timeout`.
Result run(const std::string& env, const std::string& args) {
  const std::string command =
      "env -i PATH=/usr/bin:/bin ANVIEW_LOG_LEVEL=error ANVIEW_TIMEOUT=20 " + env + " timeout 60 " +
      args;
  Result r;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  char buffer[4096];
  std::size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) r.out.append(buffer, n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string info() {
  return std::string("'") + ANVIEW_INFO_PATH + "'";
}
std::string run_ranks(int n) {
  return std::string("'") + ANVIEW_RUN_PATH + "' -n " + std::to_string(n) + " --timeout 40 " +
         info();
}

json parse(const Result& r) {
  try {
    return json::parse(r.out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not JSON (" << e.what() << "):\n" << r.out;
    return json::object();
  }
}

// One setting of each component, so a component whose objects are not linked in shows up.
const std::vector<std::string> expected_settings = {
    "ANVIEW_LOG_LEVEL",    "ANVIEW_TIMEOUT",     "ANVIEW_IFACES",     "ANVIEW_HOST_ID",
    "ANVIEW_TRANSPORTS",   "ANVIEW_SHM_RING",    "ANVIEW_SHM_CMA",    "ANVIEW_TCP_STREAMS",
    "ANVIEW_TCP_RCVLOWAT", "ANVIEW_EAGER_BYTES", "ANVIEW_RNDV_CHUNK", "ANVIEW_SPIN_US",
    "ANVIEW_SECRET"};

json find_named(const json& list, const std::string& key, const std::string& name) {
  for (const auto& item : list)
    if (item.value(key, "") == name) return item;
  return json();
}

bool shm_usable_here() {
  const json j = parse(run("", info() + " --json"));
  return find_named(j["transports"], "name", "shm").value("usable", false);
}

TEST(InfoTest, TextNamesVersionBuildTransportsAndEverySetting) {
  const Result r = run("", info());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find(std::string("anview ") + ANVIEW_VERSION), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("compiler"), std::string::npos);
  EXPECT_NE(r.out.find("  shm  "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  tcp  "), std::string::npos) << r.out;
  for (const auto& name : expected_settings)
    EXPECT_NE(r.out.find(name + "="), std::string::npos) << name << " missing:\n" << r.out;
}

TEST(InfoTest, ConfigSaysWhereEachValueCameFrom) {
  const Result r = run("ANVIEW_TCP_STREAMS=3 ANVIEW_TRANSPORT=tcp", info() + " --config --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const json j = parse(r);
  ASSERT_FALSE(j.contains("transports")) << "--config prints only the settings";
  for (const auto& name : expected_settings)
    EXPECT_FALSE(find_named(j["settings"], "name", name).is_null()) << name << " missing";
  const json streams = find_named(j["settings"], "name", "ANVIEW_TCP_STREAMS");
  EXPECT_EQ(streams.value("value", ""), "3");
  EXPECT_EQ(streams.value("source", ""), "environment");
  EXPECT_EQ(streams.value("component", ""), "tcp");
  EXPECT_FALSE(streams.value("help", "").empty());
  const json eager = find_named(j["settings"], "name", "ANVIEW_EAGER_BYTES");
  EXPECT_EQ(eager.value("source", ""), "default");
  EXPECT_EQ(eager.value("value", ""), eager.value("default", "?"));
  // A misspelt setting (ANVIEW_TRANSPORT) is reported, not ignored.
  EXPECT_EQ(j["unknown_environment"], json::array({"ANVIEW_TRANSPORT"}));
}

TEST(InfoTest, TheJobSecretIsNeverPrinted) {
  for (const std::string args : {"", " --config --json", " --json"}) {
    const Result r = run("ANVIEW_SECRET=do-not-print-me", info() + args);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_EQ(r.out.find("do-not-print-me"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("(set, not shown)"), std::string::npos) << r.out;
  }
}

TEST(InfoTest, TransportThatCannotRunSaysWhy) {
  const Result r = run("ANVIEW_IFACES=anview-no-such-if0", info() + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const json j = parse(r);
  const json tcp = find_named(j["transports"], "name", "tcp");
  EXPECT_FALSE(tcp.value("usable", true));
  EXPECT_TRUE(tcp.value("selected", false));
  EXPECT_NE(tcp.value("detail", "").find("anview-no-such-if0"), std::string::npos) << tcp;

  const Result unknown = run("ANVIEW_TRANSPORTS=tcp,carrier-pigeon", info());
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.out.find("'carrier-pigeon'"), std::string::npos) << unknown.out;
  EXPECT_NE(unknown.out.find(", not selected"), std::string::npos) << unknown.out;  // shm
}

TEST(InfoTest, PeersOnOneHost) {
  const std::string same_host = shm_usable_here() ? "shm" : "tcp";
  const json j = parse(run("", run_ranks(2) + " --peers --json"));
  ASSERT_EQ(j.value("world_size", 0), 2) << j;
  EXPECT_EQ(j["ranks"][0]["peers"][0]["transport"], same_host) << j;
  EXPECT_EQ(j["ranks"][1]["peers"][0]["transport"], same_host) << j;
  EXPECT_NE(j["ranks"][0]["peers"][0].value("reason", "").find("ANVIEW_TRANSPORTS"),
            std::string::npos)
      << j;

  const json tcp_only = parse(run("ANVIEW_TRANSPORTS=tcp", run_ranks(2) + " --peers --json"));
  EXPECT_EQ(tcp_only["ranks"][0]["peers"][0]["transport"], "tcp") << tcp_only;
}

TEST(InfoTest, PeersOverTwoEmulatedHosts) {
  const std::string same_host = shm_usable_here() ? "shm" : "tcp";
  const json j = parse(run("", run_ranks(4) + " --peers --emulate-hosts 2 --json"));
  ASSERT_EQ(j.value("world_size", 0), 4) << j;
  ASSERT_EQ(j["ranks"].size(), 4u);
  for (const auto& r : j["ranks"]) {
    const int a = r["rank"].get<int>();
    EXPECT_EQ(r["host_id"], "emulated-host-" + std::to_string(a / 2));
    ASSERT_EQ(r["peers"].size(), 3u);
    for (const auto& p : r["peers"]) {
      const int b = p["peer"].get<int>();
      const bool same = a / 2 == b / 2;
      EXPECT_EQ(p["transport"], same ? same_host : "tcp") << a << " -> " << b << ": " << p;
      if (!same) {
        EXPECT_NE(p.value("reason", "").find("shm: on another host"), std::string::npos) << p;
      }
    }
  }

  const Result text = run("", run_ranks(4) + " --peers --emulate-hosts 2");
  ASSERT_EQ(text.exit_code, 0) << text.out;
  EXPECT_NE(text.out.find("rank 0 -> rank 1: " + same_host + " ("), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("rank 0 -> rank 2: tcp ("), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("rank 3 -> rank 2: " + same_host + " ("), std::string::npos) << text.out;
}

// --explain: every candidate with its predicted time or why it cannot run, and one pick.
TEST(InfoTest, ExplainListsEveryCandidateAndThePick) {
  const Result r = run("", run_ranks(2) + " --explain allreduce 64M");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("allreduce of 67108864 bytes (float32) on 2 ranks"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("costs: alpha "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(measured at the first collective)"), std::string::npos) << r.out;
  for (const char* algo : {"shared", "direct", "recursive_doubling", "rabenseifner", "ring"})
    EXPECT_NE(r.out.find(std::string("\n  ") + algo + " "), std::string::npos) << algo << r.out;
  // A large allreduce goes through the shared slots in stages; a broadcast must fit one.
  const auto shared_line = r.out.substr(r.out.find("\n  shared "), 60);
  EXPECT_EQ(shared_line.find("cannot run"), std::string::npos) << r.out;
  const Result bcast = run("", run_ranks(2) + " --explain broadcast 64M");
  ASSERT_EQ(bcast.exit_code, 0) << bcast.out;
  EXPECT_NE(bcast.out.find("cannot run: 67108864 B > a shared slot's 262144 B"), std::string::npos)
      << bcast.out;
  std::size_t picks = 0;
  for (auto at = r.out.find("<- pick"); at != std::string::npos; at = r.out.find("<- pick", at + 1))
    ++picks;
  EXPECT_EQ(picks, 1u) << r.out;

  // Across emulated hosts the same-host algorithms cannot run, and the output says why.
  const Result hosts = run("", run_ranks(4) + " --explain allreduce 8 --emulate-hosts 2");
  ASSERT_EQ(hosts.exit_code, 0) << hosts.out;
  EXPECT_NE(hosts.out.find("messages only"), std::string::npos) << hosts.out;
  EXPECT_NE(hosts.out.find("shared  "), std::string::npos) << hosts.out;
  EXPECT_NE(hosts.out.find("cannot run: needs every rank on one host"), std::string::npos)
      << hosts.out;

  // Forced: the forced one is marked, the tuner's favourite is shown for comparison.
  const Result forced = run("ANVIEW_ALGO=allreduce=ring", run_ranks(2) + " --explain allreduce 1M");
  ASSERT_EQ(forced.exit_code, 0) << forced.out;
  EXPECT_NE(forced.out.find("<- forced by ANVIEW_ALGO"), std::string::npos) << forced.out;
  EXPECT_EQ(forced.out.find("<- pick"), std::string::npos) << forced.out;

  EXPECT_EQ(run("", run_ranks(2) + " --explain allreduse 8").exit_code, 2);
  EXPECT_EQ(run("", info() + " --explain allreduce 8").exit_code, 2);  // not under a launcher
}

}  // namespace
