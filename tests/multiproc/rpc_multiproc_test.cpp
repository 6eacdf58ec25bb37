// RPC across processes (forked here; real sockets and shared memory): a server process and
// client processes that connect by address. Shared memory on this host by default; TCP with
// ANVIEW_TRANSPORTS=tcp (the mp.rpc.tcp.* tests set it).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "anview/anview.hpp"
#include "support/child_process.hpp"

namespace {

using namespace std::chrono_literals;
using anview::testing::read_line;
using anview::testing::wait_exit;

// A server process: prints its address on `out`, answers "echo", parks "park" calls (never
// answers them) and writes one byte on `out` per parked call, and answers "sleep N" after N ms
// on its connection's thread (so it reads nothing else from that client meanwhile). Runs
// until killed.
pid_t start_server(int& address_fd) {
  const auto child = anview::testing::fork_child("server", [](int out) {
    anview::RpcServer server = anview::RpcServer::listen("127.0.0.1:0");
    server.add_method("echo",
                      [](const anview::CallContext&, const anview::Message& m) { return m; });
    server.add_method("sleep", [](const anview::CallContext&, const anview::Message& m) {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::stoi(std::string(m.text()))));
      return anview::Message("slept");
    });
    std::vector<anview::Responder> parked;
    std::mutex mu;
    server.add_async_method(
        "park", [&](const anview::CallContext&, const anview::Message&, anview::Responder r) {
          std::lock_guard lock(mu);
          parked.push_back(std::move(r));
          const char one = 1;
          if (::write(out, &one, 1) != 1) std::_Exit(3);
        });
    anview::testing::write_line(out, server.address());
    for (;;) ::pause();
    return 0;
  });
  address_fd = child.fd;
  return child.pid;
}

void stop(pid_t pid) {
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
}

// 10,000 calls in flight from one client, replies checked.
int client_calls(const std::string& address, int id) {
  anview::RpcClient client = anview::RpcClient::connect(address);
  constexpr int calls = 10000;
  std::vector<std::string> texts(calls);
  std::vector<anview::RpcCall> inflight;
  inflight.reserve(calls);
  for (int i = 0; i < calls; ++i) {
    texts[i] = std::to_string(id) + "/" + std::to_string(i) + std::string(i % 300, '#');
    inflight.push_back(
        client.call("echo", anview::Message::view(texts[i].data(), texts[i].size())));
  }
  for (int i = 0; i < calls; ++i) {
    if (inflight[i].get().text() != texts[i]) {
      std::fprintf(stderr, "client %d: wrong reply to call %d\n", id, i);
      return 1;
    }
  }
  return 0;
}

TEST(MultiprocRpc, ThreeClientProcessesTenThousandCallsEach) {
  int from_server;
  const pid_t server = start_server(from_server);
  const std::string address = read_line(from_server);
  ASSERT_FALSE(address.empty());
  std::vector<pid_t> clients;
  for (int c = 0; c < 3; ++c) {
    const auto child =
        anview::testing::fork_child("client", [&](int) { return client_calls(address, c); });
    ::close(child.fd);
    clients.push_back(child.pid);
  }
  for (pid_t pid : clients) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "client exit status " << status;
  }
  stop(server);
  ::close(from_server);
}

TEST(MultiprocRpc, ServerKilledFailsEveryPendingCallNamingIt) {
  int from_server;
  const pid_t server = start_server(from_server);
  const std::string address = read_line(from_server);
  ASSERT_FALSE(address.empty());
  anview::RpcClient client = anview::RpcClient::connect(address);
  constexpr int calls = 500;
  std::vector<anview::RpcCall> pending;
  for (int i = 0; i < calls; ++i) pending.push_back(client.call("park", anview::Message("x")));
  // Until the server holds every call (its bytes come one per parked call).
  std::atomic<bool> all_parked{false};
  std::thread reader([&] {
    char buf[calls];
    int got = 0;
    while (got < calls) {
      const auto n = ::read(from_server, buf, sizeof buf);
      if (n <= 0) break;
      got += static_cast<int>(n);
    }
    all_parked = got >= calls;
  });
  while (!all_parked) {
    client.progress();
    std::this_thread::sleep_for(1ms);
    if (::waitpid(server, nullptr, WNOHANG) != 0) break;
  }
  reader.join();
  ASSERT_TRUE(all_parked.load());
  const auto killed = std::chrono::steady_clock::now();
  stop(server);
  int failed = 0;
  for (auto& call : pending) {
    try {
      call.get();
    } catch (const anview::Error& e) {
      ++failed;
      EXPECT_TRUE(e.kind() == anview::ErrorKind::peer_lost || e.kind() == anview::ErrorKind::link)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(address), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("'park'"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(failed, calls);
  EXPECT_LT(std::chrono::steady_clock::now() - killed, 10s);
  ::close(from_server);
}

TEST(MultiprocRpc, DeadlineAcrossProcesses) {
  int from_server;
  const pid_t server = start_server(from_server);
  const std::string address = read_line(from_server);
  anview::RpcClient client = anview::RpcClient::connect(address);
  const auto start = std::chrono::steady_clock::now();
  try {
    client.call_sync("park", anview::Message("x"), {.deadline = 300ms});
    ADD_FAILURE() << "no error";
  } catch (const anview::Error& e) {
    EXPECT_EQ(e.kind(), anview::ErrorKind::timeout) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  EXPECT_EQ(client.call_sync("echo", anview::Message("alive")).text(), "alive");
  stop(server);
  ::close(from_server);
}

// A call whose deadline passes before the server took its request (the server's connection
// thread is busy with an earlier call) must not leave the request's memory in use: the caller
// may free it once the call failed. The client closes that connection instead, which fails the
// earlier call too (as a lost connection; it is not idempotent), and the next call connects
// again. The test makes the request's memory inaccessible after the failure: before, over TCP
// the client's transport read it once the server got to the request and this process died of
// SIGSEGV (over shm the server's cross-memory read failed instead).
TEST(MultiprocRpc, ARequestTheServerHasNotTakenIsNotReadAfterItsDeadline) {
  int from_server;
  const pid_t server = start_server(from_server);
  const std::string address = read_line(from_server);
  struct Stopper {
    pid_t pid;
    ~Stopper() { stop(pid); }  // also when an assertion throws
  } stopper{server};
  anview::RpcClient client = anview::RpcClient::connect(address);
  anview::RpcCall busy = client.call("sleep", anview::Message("1500"), {.deadline = 20s});
  std::this_thread::sleep_for(100ms);  // the server is in the handler

  constexpr std::size_t bytes = std::size_t{1} << 20;  // past the eager size: a rendezvous
  void* memory = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(memory, MAP_FAILED);
  std::memset(memory, 7, bytes);
  anview::Message request("tensor");
  request.add_tensor({.dtype = anview::DataType::uint8,
                      .shape = {static_cast<std::int64_t>(bytes)},
                      .data = memory});
  try {
    client.call_sync("echo", request, {.deadline = 300ms});
    ADD_FAILURE() << "no error";
  } catch (const anview::Error& e) {
    EXPECT_EQ(e.kind(), anview::ErrorKind::timeout) << e.what();
  }
  ASSERT_EQ(::mprotect(memory, bytes, PROT_NONE), 0);  // as if freed

  try {
    busy.get();
    ADD_FAILURE() << "the earlier call on the closed connection succeeded";
  } catch (const anview::Error& e) {
    EXPECT_NE(std::string(e.what()).find("before the server took its request"), std::string::npos)
        << e.what();
  }
  std::this_thread::sleep_for(1500ms);  // past the handler: the server would read the request now
  EXPECT_EQ(client.call_sync("echo", anview::Message("alive")).text(), "alive");
  ::munmap(memory, bytes);
  ::close(from_server);
}

}  // namespace
