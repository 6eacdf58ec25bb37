// The parameter server across processes (forked here): 3 server processes (the third joins at
// step 5) and 4 worker processes; every worker checks every pull against a local sum.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "anview/anview.hpp"
#include "support/child_process.hpp"

namespace {

using anview::testing::read_line;
using anview::testing::wait_exit;

constexpr int workers = 4, keys = 24, elements = 256, steps = 10;

anview::testing::Child start_server() {
  return anview::testing::fork_child("server", [](int out) {
    auto server =
        anview::ParamServer::listen("127.0.0.1:0", {.synchronous = true, .workers = workers});
    anview::testing::write_line(out, server.address());
    for (;;) ::pause();
    return 0;
  });
}

// "p<k>" (by append: GCC 12's -Wrestrict misfires on key_name(k) at -O3).
std::string key_name(int k) {
  std::string s("p");
  s.append(std::to_string(k));
  return s;
}

float gradient(int w, int s, int k, int i) {
  return static_cast<float>((w + 1) * (s + k) + i % 5);
}

int worker(int w, const std::vector<std::string>& first, const std::string& joining) {
  auto client = anview::ParamClient::connect(first, {.deadline = std::chrono::seconds(60)});
  std::vector<float> grad(elements), got(elements);
  for (int s = 1; s <= steps; ++s) {
    if (w == 0 && s == 5) client.add_server(joining);
    for (int k = 0; k < keys; ++k) {
      for (int i = 0; i < elements; ++i) grad[i] = gradient(w, s, k, i);
      client.push(key_name(k), grad.data(), elements, anview::DataType::float32, s);
    }
    for (int k = 0; k < keys; ++k) {
      client.pull(key_name(k), got.data(), elements, anview::DataType::float32, s);
      for (int i = 0; i < elements; ++i) {
        float expect = 0;
        for (int ss = 1; ss <= s; ++ss)
          for (int ww = 0; ww < workers; ++ww) expect += gradient(ww, ss, k, i);
        if (got[i] != expect) {
          std::fprintf(stderr, "worker %d step %d key %d [%d]: %f != %f\n", w, s, k, i, got[i],
                       expect);
          return 1;
        }
      }
    }
  }
  return 0;
}

TEST(MultiprocParamServer, FourWorkersTwoServersAndOneJoiningMatchALocalSum) {
  std::vector<pid_t> servers;
  std::vector<std::string> addresses;
  for (int s = 0; s < 3; ++s) {
    const auto child = start_server();
    servers.push_back(child.pid);
    addresses.push_back(read_line(child.fd));
    ::close(child.fd);
    ASSERT_FALSE(addresses.back().empty());
  }
  const std::vector<std::string> first{addresses[0], addresses[1]};
  std::vector<pid_t> pids;
  for (int w = 0; w < workers; ++w) {
    const auto child =
        anview::testing::fork_child("worker", [&](int) { return worker(w, first, addresses[2]); });
    ::close(child.fd);
    pids.push_back(child.pid);
  }
  for (pid_t pid : pids) EXPECT_EQ(wait_exit(pid), 0);
  for (pid_t pid : servers) {
    ::kill(pid, SIGKILL);
    wait_exit(pid);
  }
}

}  // namespace
