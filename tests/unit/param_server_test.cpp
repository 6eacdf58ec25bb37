// The parameter server in one process: servers listening on loopback, workers as threads with
// their own ParamClient (real connections, here over shared memory).
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "anview/anview.hpp"
#include "anview/param_server.hpp"
#include "patterns/param_protocol.hpp"

namespace anview {
namespace {

std::string key_name(int k) {
  std::string s("layer");
  s.append(std::to_string(k));
  return s;
}

// The first key_name() that `ring` gives to `server`.
std::string key_owned_by(const HashRing& ring, const std::string& server) {
  for (int k = 0;; ++k)
    if (ring.owner(key_name(k)) == server) return key_name(k);
}

TEST(HashRing, AddingAServerMovesAboutOneNthOfTheKeysAllToIt) {
  HashRing ring({"10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000", "10.0.0.4:7000"});
  constexpr int keys = 20000;
  std::unordered_map<std::string, int> load;
  std::vector<std::string> before(keys);
  for (int k = 0; k < keys; ++k) {
    before[k] = ring.owner(key_name(k));
    ++load[before[k]];
  }
  for (const auto& [server, n] : load) {
    EXPECT_GT(n, keys / 4 * 0.7) << server;  // virtual nodes keep the shares even
    EXPECT_LT(n, keys / 4 * 1.3) << server;
  }
  ring.add("10.0.0.5:7000");
  int moved = 0;
  for (int k = 0; k < keys; ++k) {
    const auto& now = ring.owner(key_name(k));
    if (now != before[k]) {
      ++moved;
      EXPECT_EQ(now, "10.0.0.5:7000");
    }
  }
  const double fraction = static_cast<double>(moved) / keys;
  EXPECT_GT(fraction, 0.2 * 0.7);
  EXPECT_LT(fraction, 0.2 * 1.3);
  ring.remove("10.0.0.5:7000");
  for (int k = 0; k < keys; ++k) EXPECT_EQ(ring.owner(key_name(k)), before[k]);
}

// Worker w's push for step s, key k, element i (small integers: float sums stay exact).
float gradient(int w, int s, int k, int i) {
  return static_cast<float>((w + 1) * (s + k) + i % 7);
}

TEST(ParamServer, SynchronousFourWorkersMatchALocalSumWhileAServerJoins) {
  constexpr int workers = 4, keys = 24, elements = 100, steps = 10;
  const ParamServerOptions options{.synchronous = true, .workers = workers};
  ParamServer a = ParamServer::listen("127.0.0.1:0", options);
  ParamServer b = ParamServer::listen("127.0.0.1:0", options);
  ParamServer c = ParamServer::listen("127.0.0.1:0", options);  // joins at step 5
  std::vector<std::string> failures(workers);
  std::vector<std::jthread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      try {
        ParamClient client = ParamClient::connect({a.address(), b.address()},
                                                  {.deadline = std::chrono::seconds(30)});
        std::vector<float> grad(elements), got(elements);
        for (int s = 1; s <= steps; ++s) {
          if (w == 0 && s == 5) client.add_server(c.address());
          for (int k = 0; k < keys; ++k) {
            for (int i = 0; i < elements; ++i) grad[i] = gradient(w, s, k, i);
            client.push(key_name(k), grad.data(), elements, DataType::float32, s);
          }
          for (int k = 0; k < keys; ++k) {
            client.pull(key_name(k), got.data(), elements, DataType::float32, s);
            for (int i = 0; i < elements; ++i) {
              float expect = 0;
              for (int ss = 1; ss <= s; ++ss)
                for (int ww = 0; ww < workers; ++ww) expect += gradient(ww, ss, k, i);
              if (got[i] != expect) {
                failures[w] = "worker " + std::to_string(w) + " step " + std::to_string(s) +
                              " key " + std::to_string(k) + "[" + std::to_string(i) +
                              "]: " + std::to_string(got[i]) + " != " + std::to_string(expect);
                return;
              }
            }
          }
        }
      } catch (const std::exception& e) {
        failures[w] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& f : failures) EXPECT_EQ(f, "");
  EXPECT_EQ(a.keys() + b.keys() + c.keys(), static_cast<std::size_t>(keys));  // none lost
  EXPECT_GT(c.keys(), 0u);
  EXPECT_LT(c.keys(), static_cast<std::size_t>(keys) * 2 / 3);
}

TEST(ParamServer, AsynchronousAverageAndRemovingAServer) {
  const ParamServerOptions options{.workers = 2, .aggregation = Aggregation::average};
  ParamServer a = ParamServer::listen("127.0.0.1:0", options);
  ParamServer b = ParamServer::listen("127.0.0.1:0", options);
  ParamClient client = ParamClient::connect({a.address(), b.address()});
  const double ones[3] = {2, 4, 6};
  for (int k = 0; k < 40; ++k) {
    client.push(key_name(k), ones, 3, DataType::float64);
    client.push(key_name(k), ones, 3, DataType::float64);
  }
  client.remove_server(b.address());
  EXPECT_EQ(a.keys(), 40u);
  EXPECT_EQ(b.keys(), 0u);
  double got[3];
  for (int k = 0; k < 40; ++k) {
    client.pull(key_name(k), got, 3, DataType::float64);
    EXPECT_EQ(got[0], 2.0);  // (2 / 2) * 2 pushes
    EXPECT_EQ(got[2], 6.0);
  }
}

// An asynchronous average divides each push on its own: on an integer key every push was
// rounded down (four pushes of 1 over 4 workers left 0). Such a push is refused, naming the key
// and what to use; floats average as before.
TEST(ParamServer, AnAsynchronousAverageOfIntegersIsRefusedNotRoundedDown) {
  ParamServer a =
      ParamServer::listen("127.0.0.1:0", {.workers = 4, .aggregation = Aggregation::average});
  ParamClient client = ParamClient::connect({a.address()});
  const std::int32_t ones[2] = {1, 1};
  try {
    client.push("n", ones, 2, DataType::int32);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::remote);
    EXPECT_NE(std::string(e.what()).find("an average of the integer key 'n' in asynchronous mode"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(a.keys(), 0u);  // nothing was created for it
  const float f[2] = {1, 1};
  for (int i = 0; i < 4; ++i) client.push("f", f, 2, DataType::float32);
  float got[2];
  client.pull("f", got, 2, DataType::float32);
  EXPECT_EQ(got[0], 1.0f);
}

TEST(ParamServer, MismatchedPushIsAnErrorNamingTheKey) {
  ParamServer a = ParamServer::listen("127.0.0.1:0");
  ParamClient client = ParamClient::connect({a.address()});
  const float v[4] = {1, 2, 3, 4};
  client.set("w", v, 4, DataType::float32);
  try {
    client.push("w", v, 3, DataType::float32);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::remote);
    EXPECT_NE(std::string(e.what()).find("key 'w' holds 4 float32"), std::string::npos) << e.what();
  }
  float got[4];
  client.pull("w", got, 4, DataType::float32);
  EXPECT_EQ(got[3], 4.0f);
}

// Expects `push` to be refused as a second push of its step by the same worker.
template <typename F>
void expect_refused_as_repeated(F push) {
  try {
    push();
    ADD_FAILURE() << "a repeated push was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::remote);
    EXPECT_NE(std::string(e.what()).find("holds this worker's push already"), std::string::npos)
        << e.what();
  }
}

// A synchronous step counts pushes, not workers: a worker that pushed a step again (its first
// reply lost to a deadline, say) took another worker's place, so the step was applied with
// this worker's values twice and without the other's, whose push then failed. Now each client
// names its pushes and a server refuses a second one of a step.
TEST(ParamServer, APushRepeatedForAStepIsRefusedNotCountedTwice) {
  ParamServer a = ParamServer::listen("127.0.0.1:0", {.synchronous = true, .workers = 2});
  ParamClient w0 = ParamClient::connect({a.address()});
  ParamClient w1 = ParamClient::connect({a.address()});
  const float mine[2] = {1, 2}, theirs[2] = {10, 20};
  w0.push("k", mine, 2, DataType::float32, 1);
  expect_refused_as_repeated([&] { w0.push("k", mine, 2, DataType::float32, 1); });
  w1.push("k", theirs, 2, DataType::float32, 1);
  float got[2] = {0, 0};
  w0.pull("k", got, 2, DataType::float32, 1);
  EXPECT_EQ(got[0], 11.0f);
  EXPECT_EQ(got[1], 22.0f);
  w0.push("k", mine, 2, DataType::float32, 2);  // the next step is another push
  w1.push("k", theirs, 2, DataType::float32, 2);
  w1.pull("k", got, 2, DataType::float32, 2);
  EXPECT_EQ(got[0], 22.0f);
  // A worker's name travels in a comma-separated list: a push naming another is refused.
  RpcClient raw = RpcClient::connect(a.address());
  Message odd("k\n3\n1,2\n");
  odd.add_tensor({.dtype = DataType::float32, .shape = {2}, .data = mine});
  try {
    raw.call_sync(patterns::param::push_method, odd);
    ADD_FAILURE() << "a push naming its worker '1,2' was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("names its worker with a number"), std::string::npos)
        << e.what();
  }
}

// The same across a move: the step in progress is handed over with the workers it holds.
TEST(ParamServer, APushRepeatedAfterItsKeyMovedIsRefusedToo) {
  const ParamServerOptions options{.synchronous = true, .workers = 2};
  ParamServer a = ParamServer::listen("127.0.0.1:0", options);
  ParamServer b = ParamServer::listen("127.0.0.1:0", options);
  ParamClient w0 = ParamClient::connect({a.address()});
  ParamClient w1 = ParamClient::connect({a.address()});
  const std::string name = key_owned_by(HashRing({a.address(), b.address()}), b.address());
  const float mine[2] = {1, 2}, theirs[2] = {10, 20};
  w0.push(name, mine, 2, DataType::float32, 1);  // on a
  w0.add_server(b.address());                    // the key, its step in progress, go to b
  ASSERT_EQ(b.keys(), 1u);
  expect_refused_as_repeated([&] { w0.push(name, mine, 2, DataType::float32, 1); });
  w1.push(name, theirs, 2, DataType::float32, 1);  // follows the move from a
  float got[2] = {0, 0};
  w1.pull(name, got, 2, DataType::float32, 1);
  EXPECT_EQ(got[0], 11.0f);
  EXPECT_EQ(got[1], 22.0f);
}

// A ring change whose handover to the new owner fails keeps the keys: the server that gave
// them up hands them over again when the change is repeated. Before, they were gone for good
// (the server had dropped them, and the repeated change was not newer). The joining server is
// a stand-in speaking the servers' protocol that refuses the first handover.
TEST(ParamServer, KeysWhoseHandoverFailedAreHandedOverWhenTheChangeIsRepeated) {
  namespace param = patterns::param;
  ParamServer a = ParamServer::listen("127.0.0.1:0");
  ParamClient client = ParamClient::connect({a.address()});
  constexpr int keys = 40;
  const float v[2] = {1, 2};
  for (int k = 0; k < keys; ++k) client.set(key_name(k), v, 2, DataType::float32);
  RpcServer joining = RpcServer::listen("127.0.0.1:0");
  std::atomic<int> adopted{0};
  std::atomic<bool> refuse{true};
  joining.add_method(param::ring_method, [](const CallContext&, const Message& m) {
    const auto state = param::parse_ring(m.text());
    return Message(std::string(param::ok_reply) + param::ring_text(state->epoch, state->ring));
  });
  joining.add_method(param::settle_method,
                     [](const CallContext&, const Message&) { return Message(param::ok_reply); });
  joining.add_method(param::adopt_method, [&](const CallContext&, const Message&) {
    if (refuse.exchange(false)) throw std::runtime_error("not now");
    ++adopted;
    return Message(param::ok_reply);
  });
  EXPECT_THROW(client.add_server(joining.address()), Error);
  client.add_server(joining.address());  // repeated
  EXPECT_GT(adopted.load(), 0);
  EXPECT_EQ(a.keys() + static_cast<std::size_t>(adopted.load()), static_cast<std::size_t>(keys))
      << "keys were lost";
}

// A handover applied by the new owner whose reply is lost fails the change, and the repeated
// change hands the key over again (the test above): the new owner must add it once. Here the
// same handover reaches a real server twice. Before, the value was added twice.
TEST(ParamServer, AHandoverRepeatedAfterALostReplyIsAddedOnce) {
  namespace param = patterns::param;
  ParamServer b = ParamServer::listen("127.0.0.1:0");
  ParamClient client = ParamClient::connect({b.address()});
  const float pushed[2] = {1, 1};
  client.push("k", pushed, 2, DataType::float32);  // reached the new owner before the handover
  const float handed[2] = {10, 20};
  RpcClient peer = RpcClient::connect(b.address());
  for (int attempt = 0; attempt < 2; ++attempt) {
    Message m("k\nfloat32\n0\n127.0.0.1:1#7\n");
    m.add_tensor({.dtype = DataType::float32, .shape = {2}, .data = handed});
    EXPECT_EQ(peer.call_sync(param::adopt_method, m).text().substr(0, param::ok_reply.size()),
              param::ok_reply);
  }
  float got[2] = {0, 0};
  client.pull("k", got, 2, DataType::float32);
  EXPECT_EQ(got[0], 11.0f);
  EXPECT_EQ(got[1], 21.0f);
  // Another handover of the key (another id) is added.
  Message m("k\nfloat32\n0\n127.0.0.1:1#8\n");
  m.add_tensor({.dtype = DataType::float32, .shape = {2}, .data = handed});
  peer.call_sync(param::adopt_method, m);
  client.pull("k", got, 2, DataType::float32);
  EXPECT_EQ(got[0], 21.0f);
}

// A handover the new owner took but whose answer was lost leaves the key pending on the giving
// server; when a later ring gives the key back to it, it must not simply keep its copy: the
// other server holds the value too and hands it back. Before, the value was counted twice.
// Now the giving server asks (ps.recall) and drops its copy when the other took it. The other
// server is a stand-in speaking the servers' protocol.
TEST(ParamServer, AKeyATakenHandoverLeftPendingIsCountedOnceWhenItComesBack) {
  namespace param = patterns::param;
  ParamServer a = ParamServer::listen("127.0.0.1:0");
  ParamClient client = ParamClient::connect({a.address()});
  std::mutex mu;  // B's handlers run on its threads: what they use outlives B
  std::string taken_id;
  std::vector<float> taken;
  std::atomic<int> recalls{0};
  RpcServer b = RpcServer::listen("127.0.0.1:0");
  const HashRing with_b({a.address(), b.address()});
  const std::string name = key_owned_by(with_b, b.address());
  const float v[2] = {1, 2};
  client.set(name, v, 2, DataType::float32);
  b.add_method(param::adopt_method, [&](const CallContext&, const Message& m) -> Message {
    std::lock_guard lock(mu);
    taken_id = std::string(param::lines(m.text()).at(3));
    const auto* values = static_cast<const float*>(m.tensors().at(0).data);
    taken.assign(values, values + 2);
    throw std::runtime_error("taken, but the answer is lost");
  });
  b.add_method(param::recall_method, [&](const CallContext&, const Message& m) {
    ++recalls;
    std::lock_guard lock(mu);
    const bool took = param::lines(m.text()).at(1) == taken_id;
    return Message(std::string(param::ok_reply) + (took ? "applied\n" : "refused\n"));
  });
  RpcClient to_a = RpcClient::connect(a.address());
  EXPECT_THROW(to_a.call_sync(param::ring_method, Message(param::ring_text(2, with_b))), Error);
  ASSERT_EQ(a.keys(), 0u);
  // The next ring gives the key back to A, which asks B: B took it, so A drops its copy...
  to_a.call_sync(param::ring_method, Message(param::ring_text(3, HashRing({a.address()}))));
  EXPECT_EQ(recalls.load(), 1);
  EXPECT_EQ(a.keys(), 0u);
  // ... and B hands its copy (A's value in it) back, naming the handover it holds.
  Message back(name + "\nfloat32\n0\n" + b.address() + "#1#1 " + taken_id + "\n");
  back.add_tensor({.dtype = DataType::float32, .shape = {2}, .data = taken.data()});
  to_a.call_sync(param::adopt_method, back);
  to_a.call_sync(param::settle_method, Message("3"));
  float got[2] = {0, 0};
  client.pull(name, got, 2, DataType::float32);
  EXPECT_EQ(got[0], 1.0f) << "the value was counted twice";
  EXPECT_EQ(got[1], 2.0f);
}

// The other side of that question: a server asked about a handover it has not taken answers
// so, and refuses it should it still arrive (its giving server kept the value).
TEST(ParamServer, AHandoverRecalledBeforeItArrivesIsNotAdded) {
  namespace param = patterns::param;
  ParamServer b = ParamServer::listen("127.0.0.1:0");
  ParamClient client = ParamClient::connect({b.address()});
  const float pushed[2] = {1, 1};
  client.push("k", pushed, 2, DataType::float32);
  RpcClient peer = RpcClient::connect(b.address());
  EXPECT_EQ(peer.call_sync(param::recall_method, Message("k\n127.0.0.1:1#9\n")).text(),
            "ok\nrefused\n");
  const float handed[2] = {10, 20};
  Message late("k\nfloat32\n0\n127.0.0.1:1#9\n");
  late.add_tensor({.dtype = DataType::float32, .shape = {2}, .data = handed});
  EXPECT_THROW(peer.call_sync(param::adopt_method, late), Error);
  float got[2] = {0, 0};
  client.pull("k", got, 2, DataType::float32);
  EXPECT_EQ(got[0], 1.0f) << "a recalled handover was added";
  // One it took is reported as taken.
  Message taken("k\nfloat32\n0\n127.0.0.1:1#10\n");
  taken.add_tensor({.dtype = DataType::float32, .shape = {2}, .data = handed});
  peer.call_sync(param::adopt_method, taken);
  client.pull("k", got, 2, DataType::float32);
  EXPECT_EQ(got[0], 11.0f);
  EXPECT_EQ(peer.call_sync(param::recall_method, Message("k\n127.0.0.1:1#10\n")).text(),
            "ok\napplied\n");
}

// A change that fails part way leaves the servers that learned its ring with its epoch; the
// next change must come with a newer one. Before, it reused the number, so those servers
// ignored it (here: giving up on a server whose add failed left the key with the old ring on
// the server that keeps it, which went on handing it to the server never added, and the
// removal failed too). The server to be added is a stand-in that refuses every handover.
TEST(ParamServer, TheChangeAfterAFailedOneComesWithANewerEpoch) {
  namespace param = patterns::param;
  ParamServer a = ParamServer::listen("127.0.0.1:0");
  ParamClient client = ParamClient::connect({a.address()});
  RpcServer b = RpcServer::listen("127.0.0.1:0");
  b.add_method(param::ring_method, [](const CallContext&, const Message& m) {
    const auto state = param::parse_ring(m.text());
    return Message(std::string(param::ok_reply) + param::ring_text(state->epoch, state->ring));
  });
  b.add_method(param::settle_method,
               [](const CallContext&, const Message&) { return Message(param::ok_reply); });
  b.add_method(param::adopt_method, [](const CallContext&, const Message&) -> Message {
    throw std::runtime_error("not now");
  });
  b.add_method(param::recall_method, [](const CallContext&, const Message&) {
    return Message(std::string(param::ok_reply) + "refused\n");
  });
  const HashRing with_b({a.address(), b.address()});
  const std::string name = key_owned_by(with_b, b.address());
  const float v[2] = {1, 2};
  client.set(name, v, 2, DataType::float32);
  EXPECT_THROW(client.add_server(b.address()), Error);
  client.remove_server(b.address());  // gives up on it: the key stays with A
  float got[2] = {0, 0};
  client.pull(name, got, 2, DataType::float32);
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], 2.0f);
  EXPECT_EQ(a.keys(), 1u);
}

}  // namespace
}  // namespace anview
