// Launcher environment detection, with the environment given as a map; where rank 0 serves
// the store.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "anview/communicator.hpp"
#include "anview/error.hpp"
#include "base/log.hpp"
#include "base/socket.hpp"
#include "bootstrap/launch_env.hpp"
#include "support/scoped_env.hpp"

namespace anview::bootstrap {
namespace {

using Env = std::map<std::string, std::string>;

LaunchInfo detect(const Env& env) {
  return detect_launch([&env](const std::string& name) -> std::optional<std::string> {
    const auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

// Expects a usage Error whose cause mentions every one of `needles`.
void expect_usage(const Env& env, std::initializer_list<std::string> needles) {
  try {
    const LaunchInfo info = detect(env);
    ADD_FAILURE() << "expected a usage Error, got launcher " << info.launcher;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::usage) << e.what();
    EXPECT_EQ(e.operation(), "bootstrap.detect_launch");
    for (const auto& n : needles) EXPECT_NE(e.cause().find(n), std::string::npos) << e.what();
  }
}

TEST(LaunchEnv, Anview) {
  const auto info = detect({{"ANVIEW_RANK", "2"},
                            {"ANVIEW_WORLD_SIZE", "4"},
                            {"ANVIEW_LOCAL_RANK", "0"},
                            {"ANVIEW_ROOT", "10.0.0.1:29500"}});
  EXPECT_EQ(info.launcher, "anview");
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.root, "10.0.0.1:29500");
}

TEST(LaunchEnv, AnviewLocalRankDefaultsToRank) {
  const auto info =
      detect({{"ANVIEW_RANK", "3"}, {"ANVIEW_WORLD_SIZE", "4"}, {"ANVIEW_ROOT", "[fe80::1]:7"}});
  EXPECT_EQ(info.local_rank, 3);
  EXPECT_EQ(info.root, "[fe80::1]:7");
}

TEST(LaunchEnv, AnviewNeedsItsRoot) {
  // MASTER_ADDR is torchrun's; an anview launch must name ANVIEW_ROOT.
  expect_usage({{"ANVIEW_RANK", "0"},
                {"ANVIEW_WORLD_SIZE", "1"},
                {"MASTER_ADDR", "h"},
                {"MASTER_PORT", "1"}},
               {"ANVIEW_ROOT", "anview"});
}

TEST(LaunchEnv, Torchrun) {
  const auto info = detect({{"RANK", "1"},
                            {"WORLD_SIZE", "8"},
                            {"LOCAL_RANK", "1"},
                            {"MASTER_ADDR", "node0"},
                            {"MASTER_PORT", "29500"}});
  EXPECT_EQ(info.launcher, "torchrun");
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.root, "node0:29500");
}

// torchrun's agent serves PyTorch's store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True,
// its default static rendezvous): Anview's rank 0 cannot serve there. Said at once, naming the
// way out; ANVIEW_ROOT still works, and so does a torchrun whose agent keeps no store there.
TEST(LaunchEnv, TorchrunsAgentStoreOnMasterPortIsNotTakenForTheRoot) {
  const std::map<std::string, std::string> env{{"RANK", "0"},
                                               {"WORLD_SIZE", "2"},
                                               {"LOCAL_RANK", "0"},
                                               {"MASTER_ADDR", "127.0.0.1"},
                                               {"MASTER_PORT", "29500"},
                                               {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  expect_usage(env, {"torchrun's own store", "ANVIEW_ROOT", "anview.torch"});
  auto with_root = env;
  with_root["ANVIEW_ROOT"] = "127.0.0.1:29600";
  EXPECT_EQ(detect(with_root).root, "127.0.0.1:29600");
  auto no_agent_store = env;
  no_agent_store["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_EQ(detect(no_agent_store).root, "127.0.0.1:29500");
}

TEST(LaunchEnv, TorchrunIpv6MasterAddrGetsBrackets) {
  const auto info = detect({{"RANK", "0"},
                            {"WORLD_SIZE", "1"},
                            {"LOCAL_RANK", "0"},
                            {"MASTER_ADDR", "fd00::2"},
                            {"MASTER_PORT", "1234"}});
  EXPECT_EQ(info.root, "[fd00::2]:1234");
}

// Found by fuzz_config: a MASTER_ADDR that cannot be a host made a root that nothing could
// parse, and the failure came later, naming no variable.
TEST(LaunchEnv, AMasterAddrThatIsNoHostIsNamed) {
  expect_usage({{"RANK", "0"},
                {"WORLD_SIZE", "2"},
                {"LOCAL_RANK", "0"},
                {"MASTER_ADDR", "fe8]:x"},
                {"MASTER_PORT", "29500"}},
               {"MASTER_ADDR='fe8]:x' is not a host name or an IP address", "torchrun"});
}

TEST(LaunchEnv, OpenMpi) {
  const auto info = detect({{"OMPI_COMM_WORLD_RANK", "5"},
                            {"OMPI_COMM_WORLD_SIZE", "6"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                            {"MASTER_ADDR", "10.1.1.1"},
                            {"MASTER_PORT", "4000"}});
  EXPECT_EQ(info.launcher, "openmpi");
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 6);
  EXPECT_EQ(info.local_rank, 2);
  EXPECT_EQ(info.root, "10.1.1.1:4000");
}

TEST(LaunchEnv, Slurm) {
  const auto info = detect({{"SLURM_PROCID", "7"},
                            {"SLURM_NTASKS", "16"},
                            {"SLURM_LOCALID", "3"},
                            {"ANVIEW_ROOT", "head:29400"}});
  EXPECT_EQ(info.launcher, "slurm");
  EXPECT_EQ(info.rank, 7);
  EXPECT_EQ(info.world_size, 16);
  EXPECT_EQ(info.local_rank, 3);
  EXPECT_EQ(info.root, "head:29400");
}

TEST(FirstSlurmHost, TheFirstNameOfTheFirstEntryAsWritten) {
  EXPECT_EQ(first_slurm_host("node1"), "node1");
  EXPECT_EQ(first_slurm_host("gpu[07-09,12],cpu3"), "gpu07");  // zero padding kept
  EXPECT_EQ(first_slurm_host("gpu[12,07-09]"), "gpu12");       // Slurm's order, not sorted
  EXPECT_EQ(first_slurm_host("n[5]-ib,m1"), "n5-ib");
  EXPECT_EQ(first_slurm_host("rack[2-3]n[01-04]"), "rack2n01");
  EXPECT_EQ(first_slurm_host("login.cluster_a,b"), "login.cluster_a");
  for (const char* bad : {"", ",n1", "n[", "n[]", "n[a-b]", "n[1-2", "n]1", "two words", "n[-1]"})
    EXPECT_EQ(first_slurm_host(bad), std::nullopt) << bad;
}

// srun sets no MASTER_ADDR: rank 0's node is the first of the step's, the port from the ids.
TEST(LaunchEnv, SlurmWithoutARootFindsRankZerosNodeInTheNodeList) {
  Env env{{"SLURM_PROCID", "3"},
          {"SLURM_NTASKS", "4"},
          {"SLURM_LOCALID", "1"},
          {"SLURM_JOB_NODELIST", "gpu[01-09]"},
          {"SLURM_STEP_NODELIST", "gpu[07-09]"},
          {"SLURM_JOB_ID", "123456"},
          {"SLURM_STEP_ID", "2"}};
  auto info = detect(env);
  EXPECT_EQ(info.root, "gpu07:24562");  // 20000 + 456 * 10 + 2
  EXPECT_EQ(info.job, "slurm job 123456 step 2");
  EXPECT_NE(info.root_source.find("SLURM_STEP_NODELIST"), std::string::npos) << info.root_source;
  EXPECT_NE(info.root_source.find("SLURM_JOB_ID"), std::string::npos) << info.root_source;
  env["MASTER_PORT"] = "29400";
  EXPECT_EQ(detect(env).root, "gpu07:29400");
  env["MASTER_ADDR"] = "head";  // what the user set wins
  info = detect(env);
  EXPECT_EQ(info.root, "head:29400");
  EXPECT_EQ(info.root_source, "");
  EXPECT_EQ(info.job, "");  // a root the user named is the user's to keep apart
  env.erase("MASTER_ADDR");
  env["ANVIEW_ROOT"] = "chosen:1";
  EXPECT_EQ(detect(env).root, "chosen:1");
}

// srun --preserve-env (as salloc's interactive step) keeps the allocation's SLURM_NTASKS: the
// step's own task count is the job's size, else rank 0 of one task waits for ranks never started.
TEST(LaunchEnv, SlurmTheStepsTaskCountWinsOverTheAllocations) {
  Env env{{"SLURM_PROCID", "0"},
          {"SLURM_NTASKS", "16"},
          {"SLURM_LOCALID", "0"},
          {"ANVIEW_ROOT", "h:1"}};
  EXPECT_EQ(detect(env).world_size, 16);
  env["SLURM_STEP_NUM_TASKS"] = "1";
  EXPECT_EQ(detect(env).world_size, 1);
  env["SLURM_PROCID"] = "1";
  expect_usage(env, {"SLURM_PROCID=1", "SLURM_STEP_NUM_TASKS=1"});
}

TEST(LaunchEnv, SlurmHeterogeneousJobsKeepTheirTaskCountAndNeedARoot) {
  Env env{{"SLURM_PROCID", "5"},         {"SLURM_NTASKS", "9"},   {"SLURM_LOCALID", "0"},
          {"SLURM_STEP_NUM_TASKS", "1"}, {"SLURM_HET_SIZE", "2"}, {"SLURM_STEP_NODELIST", "gpu1"},
          {"SLURM_JOB_ID", "12"}};
  expect_usage(env, {"heterogeneous", "MASTER_ADDR", "ANVIEW_ROOT"});
  env["MASTER_ADDR"] = "head";
  env["MASTER_PORT"] = "29400";
  const auto info = detect(env);
  EXPECT_EQ(info.world_size, 9);
  EXPECT_EQ(info.root, "head:29400");
}

TEST(LaunchEnv, SlurmRankZeroOnAnotherNodeThanTheFirstIsToldToSetTheRoot) {
  Env env{{"SLURM_PROCID", "0"},  {"SLURM_NTASKS", "2"},
          {"SLURM_LOCALID", "0"}, {"SLURM_STEP_NODELIST", "a[1-2]"},
          {"SLURM_JOB_ID", "7"},  {"SLURMD_NODENAME", "a2"}};
  expect_usage(env, {"rank 0 runs on node a2", "a1", "MASTER_ADDR", "ANVIEW_ROOT"});
  env["SLURMD_NODENAME"] = "a1";
  EXPECT_EQ(detect(env).root, "a1:20070");
  env["SLURM_PROCID"] = "1";  // only rank 0 listens there
  env["SLURMD_NODENAME"] = "a2";
  EXPECT_EQ(detect(env).root, "a1:20070");
}

TEST(LaunchEnv, SlurmWithoutWhatTheRootNeedsNamesIt) {
  // A batch script's own process: the allocation's variables, no step (srun did not start it).
  Env env{{"SLURM_PROCID", "0"},
          {"SLURM_NTASKS", "4"},
          {"SLURM_LOCALID", "0"},
          {"SLURM_JOB_ID", "12"},
          {"SLURM_JOB_NODELIST", "n[1-4]"},
          {"SLURM_NODELIST", "n[1-4]"}};
  expect_usage(env, {"SLURM_STEP_NODELIST", "srun", "MASTER_ADDR", "ANVIEW_ROOT"});
  env.erase("SLURM_JOB_ID");
  env["SLURM_STEP_NODELIST"] = "n1";
  expect_usage(env, {"SLURM_JOB_ID", "MASTER_PORT", "ANVIEW_ROOT"});
  env["SLURM_JOB_ID"] = "12x";
  expect_usage(env, {"SLURM_JOB_ID='12x'"});
  env["SLURM_JOB_ID"] = "12";
  env["SLURM_STEP_NODELIST"] = "n[1-";
  expect_usage(env, {"SLURM_STEP_NODELIST='n[1-'", "host list"});
  env["SLURM_STEP_NODELIST"] = "n1";
  env["MASTER_PORT"] = "70000";
  expect_usage(env, {"MASTER_PORT=70000"});
}

TEST(LaunchEnv, AnviewRootOverridesMasterAddrForEveryLauncher) {
  const auto info = detect({{"RANK", "0"},
                            {"WORLD_SIZE", "2"},
                            {"LOCAL_RANK", "0"},
                            {"MASTER_ADDR", "ignored"},
                            {"MASTER_PORT", "1"},
                            {"ANVIEW_ROOT", "chosen:2"}});
  EXPECT_EQ(info.root, "chosen:2");
  const auto mpi = detect({{"OMPI_COMM_WORLD_RANK", "0"},
                           {"OMPI_COMM_WORLD_SIZE", "1"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                           {"MASTER_ADDR", "ignored"},
                           {"MASTER_PORT", "1"},
                           {"ANVIEW_ROOT", "chosen:3"}});
  EXPECT_EQ(mpi.root, "chosen:3");
}

TEST(LaunchEnv, OrderOfLaunchers) {
  // torchrun under slurm: torchrun's variables win; anview's win over everything.
  Env env{{"RANK", "1"},         {"WORLD_SIZE", "2"},   {"LOCAL_RANK", "1"},
          {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_LOCALID", "0"},
          {"ANVIEW_ROOT", "h:1"}};
  EXPECT_EQ(detect(env).launcher, "torchrun");
  env["ANVIEW_RANK"] = "0";
  env["ANVIEW_WORLD_SIZE"] = "1";
  EXPECT_EQ(detect(env).launcher, "anview");
}

TEST(LaunchEnv, MissingVariablesAreNamed) {
  expect_usage({{"RANK", "0"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}},
               {"WORLD_SIZE", "torchrun"});
  expect_usage({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}},
               {"LOCAL_RANK"});
  expect_usage({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "h"}},
               {"MASTER_PORT"});
  expect_usage({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "0"}, {"MASTER_PORT", "1"}},
               {"MASTER_ADDR"});
  expect_usage({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_LOCALID", "0"}},
               {"ANVIEW_ROOT", "MASTER_ADDR", "SLURM_STEP_NODELIST", "slurm"});
  expect_usage({{"OMPI_COMM_WORLD_RANK", "0"}, {"ANVIEW_ROOT", "h:1"}},
               {"OMPI_COMM_WORLD_SIZE", "openmpi"});
  expect_usage({{"ANVIEW_RANK", "0"}, {"ANVIEW_ROOT", "h:1"}}, {"ANVIEW_WORLD_SIZE"});
}

TEST(LaunchEnv, NoLauncherListsWhatWasLookedFor) {
  expect_usage({{"PATH", "/bin"}}, {"ANVIEW_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"});
}

TEST(LaunchEnv, MalformedNumbersAreNamedWithTheirValue) {
  const Env good{{"ANVIEW_RANK", "0"}, {"ANVIEW_WORLD_SIZE", "2"}, {"ANVIEW_ROOT", "h:1"}};
  for (const char* bad : {"abc", "1x", " 1", "1 ", "+1", "0x1", "1.0", "99999999999"}) {
    SCOPED_TRACE(bad);
    Env env = good;
    env["ANVIEW_RANK"] = bad;
    expect_usage(env, {"ANVIEW_RANK", std::string("'") + bad + "'"});
    env = good;
    env["ANVIEW_WORLD_SIZE"] = bad;
    expect_usage(env, {"ANVIEW_WORLD_SIZE", bad});
    env = good;
    env["ANVIEW_LOCAL_RANK"] = bad;
    expect_usage(env, {"ANVIEW_LOCAL_RANK", bad});
  }
  expect_usage({{"RANK", "0"},
                {"WORLD_SIZE", "1"},
                {"LOCAL_RANK", "0"},
                {"MASTER_ADDR", "h"},
                {"MASTER_PORT", "http"}},
               {"MASTER_PORT", "http"});
  expect_usage({{"RANK", "0"},
                {"WORLD_SIZE", "1"},
                {"LOCAL_RANK", "0"},
                {"MASTER_ADDR", "h"},
                {"MASTER_PORT", "70000"}},
               {"MASTER_PORT", "70000"});
  for (const char* root : {"nohostport", "h:", ":1", "h:0", "h:x", "fe80::1:5", "[fe80::1]"}) {
    SCOPED_TRACE(root);
    Env env = good;
    env["ANVIEW_ROOT"] = root;
    expect_usage(env, {"ANVIEW_ROOT", root});
  }
}

TEST(LaunchEnv, RankMustBeBelowWorldSize) {
  expect_usage({{"ANVIEW_RANK", "4"}, {"ANVIEW_WORLD_SIZE", "4"}, {"ANVIEW_ROOT", "h:1"}},
               {"ANVIEW_RANK=4", "ANVIEW_WORLD_SIZE=4"});
  expect_usage({{"SLURM_PROCID", "-1"},
                {"SLURM_NTASKS", "4"},
                {"SLURM_LOCALID", "0"},
                {"ANVIEW_ROOT", "h:1"}},
               {"SLURM_PROCID=-1"});
  expect_usage({{"RANK", "0"},
                {"WORLD_SIZE", "0"},
                {"LOCAL_RANK", "0"},
                {"MASTER_ADDR", "h"},
                {"MASTER_PORT", "1"}},
               {"WORLD_SIZE=0"});
  expect_usage({{"ANVIEW_RANK", "0"},
                {"ANVIEW_WORLD_SIZE", "2"},
                {"ANVIEW_LOCAL_RANK", "2"},
                {"ANVIEW_ROOT", "h:1"}},
               {"ANVIEW_LOCAL_RANK=2"});
}

TEST(EmulatedHost, ConsecutiveRanksShareAHost) {
  for (const auto& [rank, world, hosts, id, first, ranks] :
       std::vector<std::tuple<int, int, int, std::string, int, int>>{
           {0, 5, 2, "emulated-host-0", 0, 3},
           {2, 5, 2, "emulated-host-0", 0, 3},
           {4, 5, 2, "emulated-host-1", 3, 2},
           {6, 7, 3, "emulated-host-2", 5, 2},
           {3, 4, 4, "emulated-host-3", 3, 1}}) {
    const auto host = emulated_host(rank, world, hosts);
    EXPECT_EQ(host.id, id) << rank << " of " << world << " on " << hosts;
    EXPECT_EQ(host.first_rank, first) << rank << " of " << world << " on " << hosts;
    EXPECT_EQ(host.ranks, ranks) << rank << " of " << world << " on " << hosts;
  }
}

TEST(StoreServeAddress, ANameThatResolvesToLoopbackIsServedEverywhere) {
  EXPECT_TRUE(serve_everywhere("node7", "127.0.1.1"));  // Debian's /etc/hosts for its own name
  EXPECT_TRUE(serve_everywhere("node7.cluster", "127.0.0.1"));
  EXPECT_TRUE(serve_everywhere("node7", "::1"));
  EXPECT_FALSE(serve_everywhere("node7", "10.0.0.7"));
  EXPECT_FALSE(serve_everywhere("node7", "fe80::1"));
  // Loopback asked for: a single-host job, not exposed to the network.
  EXPECT_FALSE(serve_everywhere("127.0.0.1", "127.0.0.1"));
  EXPECT_FALSE(serve_everywhere("127.0.1.1", "127.0.1.1"));
  EXPECT_FALSE(serve_everywhere("::1", "::1"));
  EXPECT_FALSE(serve_everywhere("localhost", "127.0.0.1"));
  EXPECT_FALSE(serve_everywhere("ip6-localhost", "::1"));
  EXPECT_FALSE(serve_everywhere("a.localhost", "127.0.0.1"));
}

TEST(StoreServeAddress, AddressesAndLocalhostAreServedAsGiven) {
  for (const std::string root : {"127.0.0.1:29500", "localhost:29500", "[::1]:29500"}) {
    const ServeAddress serve = store_serve_address(root, 0);
    EXPECT_EQ(serve.address, root);
    EXPECT_EQ(serve.why, "");
  }
}

std::string this_host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "";
  return name;
}

// The address listening on `port` in /proc/net/tcp, as the kernel writes it ("0100007F" is
// 127.0.0.1, "00000000" every address), or "" when nothing listens there.
std::string listener_on(std::uint16_t port) {
  std::ifstream table("/proc/net/tcp");
  std::string line;
  std::getline(table, line);  // the column names
  while (std::getline(table, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    const auto colon = local.find(':');
    if (state == "0A" && colon != std::string::npos &&
        std::stoul(local.substr(colon + 1), nullptr, 16) == port)
      return local.substr(0, colon);
  }
  return "";
}

// The machine's own name, where it resolves to a loopback address (as here and on Debian's
// defaults): rank 0 of a job rooted at that name serves the store on every address, so ranks
// on other hosts reach it, and says why. Elsewhere the root is served as given.
TEST(StoreServeAddress, RankZeroOfAJobRootedAtThisHostsNameIsReachableFromOtherHosts) {
  const std::string host = this_host_name();
  ASSERT_FALSE(host.empty());
  std::uint16_t port = 0;
  {  // a free port
    const auto probe = base::listen_tcp(
        base::SockAddr::from_host_port("127.0.0.1", 0, {.operation = "test"}), 1, {});
    port = base::local_address(probe.get()).port();
  }
  const std::string root = host + ":" + std::to_string(port);
  base::SockAddr resolved;
  try {
    resolved = base::SockAddr::from_host_port(host, port, {.operation = "test"});
  } catch (const Error& e) {
    GTEST_SKIP() << "this machine's name does not resolve here: " << e.what();
  }
  const bool loopback = resolved.host().starts_with("127.") || resolved.host() == "::1";
  const ServeAddress serve = store_serve_address(root, 0);
  if (!loopback) {
    EXPECT_EQ(serve.address, root);
    GTEST_SKIP() << host << " resolves to " << resolved.host() << ", not to loopback, here";
  }
  EXPECT_NE(serve.why.find("'" + host + "' resolves to " + resolved.host()), std::string::npos)
      << serve.why;
  if (resolved.family() != AF_INET) GTEST_SKIP() << "the listener check reads IPv4 sockets";
  EXPECT_EQ(serve.address, "0.0.0.0:" + std::to_string(port));
  const testing::ScopedEnv rank("ANVIEW_RANK", "0"), world("ANVIEW_WORLD_SIZE", "1"),
      at("ANVIEW_ROOT", root.c_str()), secret("ANVIEW_SECRET", "test-secret");
  {
    const Communicator comm = Communicator::from_env();
    EXPECT_EQ(comm.size(), 1);
    EXPECT_EQ(listener_on(port), "00000000");  // every address, not 127.0.0.1 only
  }
  base::set_log_rank(-1);  // from_env() set it for the process (the other tests' default)
}

}  // namespace
}  // namespace anview::bootstrap
