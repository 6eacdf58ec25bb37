#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "anview/param_server.hpp"
#include "base/log.hpp"
#include "base/random.hpp"
#include "patterns/param_protocol.hpp"

namespace anview {

namespace param = patterns::param;

namespace detail {
namespace {

bool supported(DataType t) {
  return t == DataType::float32 || t == DataType::float64 || t == DataType::int32 ||
         t == DataType::int64;
}

template <typename T>
void add_scaled(std::byte* dst, const std::byte* src, std::size_t count, int divisor) {
  for (std::size_t i = 0; i < count; ++i) {
    T a, b;
    std::memcpy(&a, dst + i * sizeof(T), sizeof(T));
    std::memcpy(&b, src + i * sizeof(T), sizeof(T));
    a += divisor > 1 ? static_cast<T>(b / static_cast<T>(divisor)) : b;
    std::memcpy(dst + i * sizeof(T), &a, sizeof(T));
  }
}

// dst += src / divisor, elementwise.
void accumulate(DataType t, std::vector<std::byte>& dst, const std::byte* src, int divisor) {
  const std::size_t n = dst.size() / size_of(t);
  switch (t) {
    case DataType::float32:
      add_scaled<float>(dst.data(), src, n, divisor);
      break;
    case DataType::float64:
      add_scaled<double>(dst.data(), src, n, divisor);
      break;
    case DataType::int32:
      add_scaled<std::int32_t>(dst.data(), src, n, divisor);
      break;
    case DataType::int64:
      add_scaled<std::int64_t>(dst.data(), src, n, divisor);
      break;
    default:
      break;  // refused before
  }
}

struct StepSum {
  std::vector<std::byte> sum;
  int count = 0;
  // The clients whose pushes it holds (those that named themselves): a push repeated, as after
  // a reply lost to a deadline, would otherwise count as another worker's and complete the step
  // with a wrong sum.
  std::unordered_set<std::string> pushers;
};

struct Key {
  DataType type = DataType::float32;
  std::vector<std::byte> value;
  bool provisional = false;   // created while its ring was unsettled: pulls wait for settle
  std::uint64_t applied = 0;  // synchronous: the last step applied
  std::map<std::uint64_t, StepSum> steps;                  // synchronous: steps being pushed
  std::vector<std::pair<std::uint64_t, Responder>> pulls;  // waiting for a step (or settle)
  // Names its handover to another server, from when it left this one: a handover repeated
  // (its reply lost, so the change failed and was repeated) carries the same id, and the new
  // owner adds it once.
  std::string handover_id;
  // The servers it was handed to while its handover had not succeeded: one may have taken it
  // (its reply lost) when a later ring gives the key back to this server (ParamServerImpl::
  // take_back()).
  std::vector<std::string> handed_to;
  // The ids of the last handovers whose values this key holds; they travel with it, so the
  // server a handover came from can tell its own value is in a copy handed back.
  std::vector<std::string> adopted;
};

// How many handover ids a key remembers: a repeat follows its first attempt within one ring
// change, long before this many other handovers of the same key.
constexpr std::size_t adopted_ids_kept = 16;
// How many handover ids a server remembers having applied (for ps.recall, also after the key
// moved on) and having refused (recalled before they arrived).
constexpr std::size_t ids_kept = 16384;

// A bounded set of handover ids, the oldest forgotten first.
class IdLog {
 public:
  bool contains(const std::string& id) const { return set_.contains(id); }
  void add(const std::string& id) {
    if (!set_.insert(id).second) return;
    order_.push_back(id);
    if (order_.size() > ids_kept) {
      set_.erase(order_.front());
      order_.pop_front();
    }
  }

 private:
  std::deque<std::string> order_;
  std::unordered_set<std::string> set_;
};

bool holds(const Key& key, std::string_view id) {
  return std::find(key.adopted.begin(), key.adopted.end(), id) != key.adopted.end();
}

void remember(Key& key, std::string id) {
  if (holds(key, id)) return;
  if (key.adopted.size() == adopted_ids_kept) key.adopted.erase(key.adopted.begin());
  key.adopted.push_back(std::move(id));
}

}  // namespace

class ParamServerImpl {
 public:
  explicit ParamServerImpl(const std::string& host_port, ParamServerOptions options);
  // The RPC server's threads run the handlers, which use the members below: stop them first.
  ~ParamServerImpl() { rpc_.shutdown(); }
  ParamServerImpl(const ParamServerImpl&) = delete;
  ParamServerImpl& operator=(const ParamServerImpl&) = delete;
  std::string address() const { return self_; }
  std::size_t keys() const {
    std::lock_guard lock(mu_);
    return keys_.size();
  }
  void shutdown() { rpc_.shutdown(); }

 private:
  // Handlers (mu_ taken inside).
  void push(const Message& request, Responder reply);
  void pull(const Message& request, Responder reply);
  Message set(const Message& request);
  Message ring(const Message& request);
  Message adopt(const Message& request);
  Message recall(const Message& request);
  Message settle(const Message& request);

  // mu_ held: the moved reply when `key` is not this server's, else empty.
  std::optional<Message> moved(std::string_view key) const;
  Key& key_for(const std::string& name, DataType type, std::size_t bytes);
  void apply_ready(Key& key);
  // Answers the pulls of `key` that can be answered now.
  void answer_pulls(Key& key);
  static const Tensor& values(const Message& m, std::string_view what);
  Message value_reply(const Key& key) const;
  // Sends `key` to `owner`, the server the ring now gives it to; raises if that fails.
  void hand_over(const std::string& name, const Key& key, const std::string& owner);
  // mu_ held: adds `from` (a handover, or this server's own copy back) to the key here.
  void absorb(const std::string& name, Key&& from);
  // `key`, whose handover had not succeeded, is this server's again: kept, unless a server it
  // was handed to took it after all (that server hands its copy, this one's value in it, back).
  void take_back(const std::string& name, Key&& key);
  // Whether a server other than `except` that `key` was handed to (its answer lost) took it
  // after all (ps.recall); those that did not refuse it from now on. One that cannot be asked
  // is taken to have not (logged).
  bool taken_before(const std::string& name, const Key& key, const std::string& except);
  // mu_ held: a handover id for a key leaving now.
  std::string next_handover_id() { return handover_prefix_ + std::to_string(++handovers_); }
  RpcClient& peer(const std::string& address);
  std::string owner_of(const std::string& name) const {
    std::lock_guard lock(mu_);
    return ring_.owner(name);
  }

  ParamServerOptions options_;
  RpcServer rpc_;
  std::string self_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Key> keys_;
  // Keys a ring change took from here whose handover to their new owner failed: the next ring
  // call (the client repeats a change that failed) hands them over again.
  std::vector<std::pair<std::string, Key>> handover_;
  // Handover ids: this server's address, a number of this process (a server restarted on the
  // same address must not repeat an id) and a counter.
  const std::string handover_prefix_;
  std::uint64_t handovers_ = 0;
  // Handovers applied here (with the ids of those their values held), and those recalled by
  // their giving server before they arrived: never applied.
  IdLog applied_, refused_;
  std::uint64_t epoch_ = 0;
  HashRing ring_;
  bool settled_ = true;
  // Pulls of keys not here yet while the ring is unsettled (they may be on their way).
  std::unordered_map<std::string, std::vector<std::pair<std::uint64_t, Responder>>> orphan_pulls_;
  std::mutex peers_mu_;
  std::map<std::string, RpcClient> peers_;
};

ParamServerImpl::ParamServerImpl(const std::string& host_port, ParamServerOptions options)
    : options_(options),
      rpc_(RpcServer::listen(host_port, options.rpc)),
      self_(rpc_.address()),
      handover_prefix_(self_ + "#" + std::to_string(base::random_u64()) + "#") {
  if (options_.workers < 1)
    throw Error(ErrorKind::usage, {.operation = "param server",
                                   .cause = "workers is " + std::to_string(options_.workers)});
  rpc_.add_async_method(param::push_method, [this](const CallContext&, const Message& m,
                                                   Responder r) { push(m, std::move(r)); });
  rpc_.add_async_method(param::pull_method, [this](const CallContext&, const Message& m,
                                                   Responder r) { pull(m, std::move(r)); });
  rpc_.add_method(param::set_method,
                  [this](const CallContext&, const Message& m) { return set(m); });
  rpc_.add_method(param::ring_method,
                  [this](const CallContext&, const Message& m) { return ring(m); });
  rpc_.add_method(param::adopt_method,
                  [this](const CallContext&, const Message& m) { return adopt(m); });
  rpc_.add_method(param::recall_method,
                  [this](const CallContext&, const Message& m) { return recall(m); });
  rpc_.add_method(param::settle_method,
                  [this](const CallContext&, const Message& m) { return settle(m); });
}

const Tensor& ParamServerImpl::values(const Message& m, std::string_view what) {
  if (m.tensors().empty() || !supported(m.tensors()[0].dtype))
    throw Error(ErrorKind::usage,
                {.operation = std::string(what),
                 .cause = "values must be one tensor of float32, float64, int32 or int64"});
  return m.tensors()[0];
}

std::optional<Message> ParamServerImpl::moved(std::string_view key) const {
  // Without a ring yet (a server joining), the empty ring of epoch 0: the client asks again.
  if (epoch_ == 0) return Message(std::string(param::moved_reply) + "0 1\n");
  if (ring_.owner(key) == self_) return std::nullopt;
  return Message(std::string(param::moved_reply) + param::ring_text(epoch_, ring_));
}

Key& ParamServerImpl::key_for(const std::string& name, DataType type, std::size_t bytes) {
  auto [it, created] = keys_.try_emplace(name);
  Key& key = it->second;
  if (created) {
    key.type = type;
    key.value.assign(bytes, std::byte{0});
    key.provisional = !settled_;
    if (auto orphans = orphan_pulls_.find(name); orphans != orphan_pulls_.end()) {
      key.pulls = std::move(orphans->second);
      orphan_pulls_.erase(orphans);
    }
  } else if (key.type != type || key.value.size() != bytes) {
    throw std::runtime_error(
        "key '" + name + "' holds " + std::to_string(key.value.size() / size_of(key.type)) + " " +
        std::string(name_of(key.type)) + "; this has " + std::to_string(bytes / size_of(type)) +
        " " + std::string(name_of(type)));
  }
  return key;
}

Message ParamServerImpl::value_reply(const Key& key) const {
  auto copy = std::make_shared<std::vector<std::byte>>(key.value);
  Message m(param::ok_reply);
  m.add_tensor({.dtype = key.type,
                .shape = {static_cast<std::int64_t>(copy->size() / size_of(key.type))},
                .data = copy->data()});
  m.keep_alive(copy);
  return m;
}

void ParamServerImpl::apply_ready(Key& key) {
  const int divisor = options_.aggregation == Aggregation::average ? options_.workers : 1;
  for (auto it = key.steps.begin(); it != key.steps.end() && it->first == key.applied + 1 &&
                                    it->second.count == options_.workers;
       it = key.steps.erase(it)) {
    accumulate(key.type, key.value, it->second.sum.data(), divisor);
    key.applied = it->first;
  }
}

void ParamServerImpl::answer_pulls(Key& key) {
  if (key.provisional) return;
  std::vector<std::pair<std::uint64_t, Responder>> waiting;
  waiting.swap(key.pulls);
  for (auto& [step, responder] : waiting) {
    if (!options_.synchronous || step <= key.applied) {
      responder.reply(value_reply(key));
    } else {
      key.pulls.emplace_back(step, std::move(responder));
    }
  }
}

void ParamServerImpl::push(const Message& request, Responder reply) {
  const auto ls = param::lines(request.text());
  const auto step = ls.size() >= 2 ? param::number(ls[1]) : std::nullopt;
  if (ls.size() < 2 || !step) throw std::runtime_error("a push needs a key and a step");
  const Tensor& t = values(request, "push");
  const std::string name(ls[0]);
  // The worker that pushes (synchronous steps count one push each): a number, as it travels in
  // a comma-separated list in handovers. Without one (an older client): not named.
  const std::string pusher(ls.size() >= 3 ? ls[2] : std::string_view());
  if (!pusher.empty() && !param::number(pusher))
    throw std::runtime_error("a push names its worker with a number, not '" + pusher + "'");
  std::lock_guard lock(mu_);
  if (auto m = moved(name)) return reply.reply(*m);
  // Each asynchronous push is divided on its own: integers would be rounded down every time
  // (four pushes of 1 over 4 workers left 0).
  if (!options_.synchronous && options_.aggregation == Aggregation::average &&
      options_.workers > 1 && (t.dtype == DataType::int32 || t.dtype == DataType::int64))
    throw std::runtime_error("an average of the integer key '" + name +
                             "' in asynchronous mode would round every push down (each is "
                             "divided by " +
                             std::to_string(options_.workers) +
                             "): use sum, a floating-point type, or synchronous mode");
  Key& key = key_for(name, t.dtype, t.bytes());
  const auto* data = static_cast<const std::byte*>(t.data);
  if (!options_.synchronous) {
    accumulate(key.type, key.value, data,
               options_.aggregation == Aggregation::average ? options_.workers : 1);
  } else {
    if (*step == 0 || *step <= key.applied)
      throw std::runtime_error("step " + std::to_string(*step) + " of '" + name +
                               "' is not after the last applied (" + std::to_string(key.applied) +
                               ")");
    StepSum& s = key.steps[*step];
    if (s.sum.empty()) s.sum.assign(key.value.size(), std::byte{0});
    if (!pusher.empty() && s.pushers.contains(pusher))
      throw std::runtime_error("step " + std::to_string(*step) + " of '" + name +
                               "' holds this worker's push already: a push counts once (was it "
                               "repeated after its reply was lost?)");
    if (s.count >= options_.workers)
      throw std::runtime_error("step " + std::to_string(*step) + " of '" + name +
                               "' has all its pushes already");
    accumulate(key.type, s.sum, data, 1);
    ++s.count;
    if (!pusher.empty()) s.pushers.insert(pusher);
    apply_ready(key);
  }
  answer_pulls(key);
  reply.reply(Message(param::ok_reply));
}

void ParamServerImpl::pull(const Message& request, Responder reply) {
  const auto ls = param::lines(request.text());
  const auto step = ls.size() >= 2 ? param::number(ls[1]) : std::nullopt;
  if (ls.size() < 2 || !step) throw std::runtime_error("a pull needs a key and a step");
  const std::string name(ls[0]);
  std::lock_guard lock(mu_);
  if (auto m = moved(name)) return reply.reply(*m);
  auto it = keys_.find(name);
  if (it == keys_.end()) {
    if (settled_) throw std::runtime_error("no key '" + name + "' on " + self_);
    orphan_pulls_[name].emplace_back(*step, std::move(reply));  // it may be on its way here
    return;
  }
  it->second.pulls.emplace_back(*step, std::move(reply));
  answer_pulls(it->second);
}

Message ParamServerImpl::set(const Message& request) {
  const auto ls = param::lines(request.text());
  if (ls.empty()) throw std::runtime_error("a set needs a key");
  const Tensor& t = values(request, "set");
  const std::string name(ls[0]);
  std::lock_guard lock(mu_);
  if (auto m = moved(name)) return *m;
  auto& key = keys_[name];
  key.type = t.dtype;
  key.value.assign(static_cast<const std::byte*>(t.data),
                   static_cast<const std::byte*>(t.data) + t.bytes());
  key.steps.clear();
  answer_pulls(key);
  return Message(param::ok_reply);
}

Message ParamServerImpl::ring(const Message& request) {
  auto state = param::parse_ring(request.text());
  if (!state || state->ring.servers().empty()) throw std::runtime_error("a malformed ring");
  std::vector<std::pair<std::string, Key>> leaving, returning;
  {
    std::lock_guard lock(mu_);
    leaving.swap(handover_);
    if (state->epoch > epoch_) {
      epoch_ = state->epoch;
      ring_ = std::move(state->ring);
      settled_ = epoch_ == 1;  // the first ring moves nothing
      for (auto it = keys_.begin(); it != keys_.end();) {
        if (ring_.owner(it->first) != self_) {
          it->second.handover_id = next_handover_id();
          leaving.emplace_back(it->first, std::move(it->second));
          it = keys_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto it = leaving.begin(); it != leaving.end();) {
      // A copy that came back to this server holds it already (the one it was handed to took
      // it, and passed it back within its own).
      if (const auto here = keys_.find(it->first);
          here != keys_.end() && holds(here->second, it->second.handover_id)) {
        it = leaving.erase(it);
        continue;
      }
      // A key an earlier change could not hand over whose owner is this server again.
      if (ring_.owner(it->first) == self_) {
        returning.push_back(std::move(*it));
        it = leaving.erase(it);
      } else {
        ++it;
      }
    }
    const Message moved_to(std::string(param::moved_reply) + param::ring_text(epoch_, ring_));
    for (auto& [name, key] : leaving) {
      for (auto& [step, responder] : key.pulls) responder.reply(moved_to);  // they follow it
      key.pulls.clear();
    }
    for (auto it = orphan_pulls_.begin(); it != orphan_pulls_.end();) {
      if (ring_.owner(it->first) != self_) {
        for (auto& [step, responder] : it->second) responder.reply(moved_to);
        it = orphan_pulls_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (std::size_t i = 0; i < returning.size(); ++i) {
    try {
      take_back(returning[i].first, std::move(returning[i].second));
    } catch (...) {
      // Kept, not lost (take_back() kept its own key): the change is repeated.
      std::lock_guard lock(mu_);
      for (std::size_t j = i + 1; j < returning.size(); ++j)
        handover_.push_back(std::move(returning[j]));
      for (auto& entry : leaving) handover_.push_back(std::move(entry));
      throw;
    }
  }
  // Hand the keys to their new owners (outside the lock: the owner may call back).
  for (std::size_t i = 0; i < leaving.size(); ++i) {
    try {
      auto& [name, key] = leaving[i];
      // Going elsewhere than before: one it went to may have taken it (and passes it on itself).
      const std::string owner = owner_of(name);
      if (std::find(key.handed_to.begin(), key.handed_to.end(), owner) == key.handed_to.end()) {
        if (taken_before(name, key, owner)) continue;
        key.handed_to.push_back(owner);
      }
      hand_over(name, key, owner);
    } catch (...) {
      // Kept, not lost: the keys not handed over wait for the change to be repeated.
      std::lock_guard lock(mu_);
      for (std::size_t j = i; j < leaving.size(); ++j) handover_.push_back(std::move(leaving[j]));
      throw;  // the ring call fails: the client's change fails and may be repeated
    }
  }
  std::lock_guard lock(mu_);
  base::log("ps", base::LogLevel::info, "param server ", self_, ": ring epoch ", epoch_, ", ",
            leaving.size(), " keys handed over, ", keys_.size(), " kept");
  return Message(std::string(param::ok_reply) + param::ring_text(epoch_, ring_));
}

void ParamServerImpl::hand_over(const std::string& name, const Key& key, const std::string& owner) {
  // The id, then those of the handovers whose values the key holds.
  std::string ids = key.handover_id;
  for (const auto& id : key.adopted) ids += " " + id;
  std::string header = name + "\n" + std::string(name_of(key.type)) + "\n" +
                       std::to_string(key.applied) + "\n" + ids + "\n";
  // "step count pusher,pusher,...": the pushers travel with the partial sum (none: "step
  // count", as before pushes named their worker).
  for (const auto& [step, sum] : key.steps) {
    header += std::to_string(step) + " " + std::to_string(sum.count);
    bool first = true;
    for (const auto& pusher : sum.pushers) {
      header += (first ? " " : ",") + pusher;
      first = false;
    }
    header += "\n";
  }
  Message m(header);
  const auto count = static_cast<std::int64_t>(key.value.size() / size_of(key.type));
  m.add_tensor({.dtype = key.type, .shape = {count}, .data = key.value.data()});
  for (const auto& [step, sum] : key.steps)
    m.add_tensor({.dtype = key.type, .shape = {count}, .data = sum.sum.data()});
  peer(owner).call_sync(param::adopt_method, m);  // raises: the move failed
}

RpcClient& ParamServerImpl::peer(const std::string& address) {
  std::lock_guard lock(peers_mu_);
  auto it = peers_.find(address);
  if (it == peers_.end()) it = peers_.emplace(address, RpcClient::connect(address)).first;
  return it->second;
}

void ParamServerImpl::take_back(const std::string& name, Key&& key) {
  if (taken_before(name, key, "")) return;
  std::lock_guard lock(mu_);
  // A server that took it has handed its copy back already.
  if (auto it = keys_.find(name); it != keys_.end() && holds(it->second, key.handover_id)) {
    base::log("ps", base::LogLevel::info, "param server ", self_, ": '", name,
              "' came back within a copy handed back; this server's own is dropped");
    return;
  }
  try {
    absorb(name, std::move(key));  // (raises before it takes anything: another type or size)
  } catch (...) {
    // Kept for the next change, as another handover: the servers asked refuse this one.
    key.handover_id = next_handover_id();
    key.handed_to.clear();
    handover_.emplace_back(name, std::move(key));
    throw;
  }
}

bool ParamServerImpl::taken_before(const std::string& name, const Key& key,
                                   const std::string& except) {
  for (const auto& to : key.handed_to) {
    if (to == except) continue;
    try {
      const Message reply =
          peer(to).call_sync(param::recall_method, Message(name + "\n" + key.handover_id + "\n"));
      if (reply.text() == std::string(param::ok_reply) + "applied\n") {
        base::log("ps", base::LogLevel::info, "param server ", self_, ": '", name,
                  "' was taken by ", to, " after all (its answer was lost); not sent again");
        return true;
      }
    } catch (const std::exception& e) {
      base::log("ps", base::LogLevel::warn, "param server ", self_, ": '", name, "' was handed to ",
                to, " (its answer lost), which cannot say whether it took it (", e.what(),
                "): kept, and counted twice should that server have taken it");
    }
  }
  return false;
}

void ParamServerImpl::absorb(const std::string& name, Key&& from) {
  // Pushes that reached this server first are added: aggregation is linear.
  Key& key = key_for(name, from.type, from.value.size());
  accumulate(key.type, key.value, from.value.data(), 1);
  key.applied = std::max(key.applied, from.applied);
  for (auto& [step, sum] : from.steps) {
    StepSum& s = key.steps[step];
    if (s.sum.empty()) s.sum.assign(key.value.size(), std::byte{0});
    accumulate(key.type, s.sum, sum.sum.data(), 1);
    s.count += sum.count;
    s.pushers.merge(sum.pushers);
  }
  for (auto& id : from.adopted) {
    applied_.add(id);
    remember(key, std::move(id));
  }
  apply_ready(key);
  answer_pulls(key);
}

Message ParamServerImpl::recall(const Message& request) {
  const auto ls = param::lines(request.text());
  if (ls.size() < 2 || ls[1].empty()) throw std::runtime_error("a malformed recall");
  const std::string name(ls[0]), id(ls[1]);
  std::lock_guard lock(mu_);
  // Applied here (the value is here, or went on with the key).
  if (applied_.contains(id)) return Message(std::string(param::ok_reply) + "applied\n");
  // Should it still arrive, it is not applied: its giving server keeps the value.
  refused_.add(id);
  return Message(std::string(param::ok_reply) + "refused\n");
}

Message ParamServerImpl::adopt(const Message& request) {
  const auto ls = param::lines(request.text());
  if (ls.size() < 4) throw std::runtime_error("a malformed handover");
  const std::string name(ls[0]);
  const auto applied = param::number(ls[2]);
  const auto type = data_type_named(ls[1]);
  // The handover's id, then those of the handovers whose values it holds.
  std::vector<std::string> ids;
  for (std::string_view rest = ls[3]; !rest.empty();) {
    const auto space = rest.find(' ');
    if (space != 0) ids.emplace_back(rest.substr(0, space));
    rest = space == std::string_view::npos ? std::string_view() : rest.substr(space + 1);
  }
  if (!applied || !type || ids.empty() || request.tensors().size() != ls.size() - 3)
    throw std::runtime_error("a malformed handover of '" + name + "'");
  const Tensor& value = values(request, "adopt");
  Key from;
  from.type = *type;
  from.applied = *applied;
  const auto* bytes = static_cast<const std::byte*>(value.data);
  from.value.assign(bytes, bytes + value.bytes());
  for (std::size_t i = 4; i < ls.size(); ++i) {
    // "step count" and, since pushes name their worker, " pusher,pusher,...".
    const std::string_view line = ls[i];
    const auto space = line.find(' ');
    const auto second = space == std::string_view::npos ? space : line.find(' ', space + 1);
    const auto step = param::number(line.substr(0, space));
    const auto count = space == std::string_view::npos
                           ? std::nullopt
                           : param::number(line.substr(space + 1, second - space - 1));
    const Tensor& sum = request.tensors()[i - 3];
    if (!step || !count || sum.bytes() != value.bytes() || from.steps.contains(*step))
      throw std::runtime_error("a malformed step in the handover of '" + name + "'");
    StepSum& s = from.steps[*step];
    const auto* partial = static_cast<const std::byte*>(sum.data);
    s.sum.assign(partial, partial + sum.bytes());
    s.count = static_cast<int>(*count);
    if (second == std::string_view::npos) continue;
    for (std::string_view rest = line.substr(second + 1); !rest.empty();) {
      const auto comma = rest.find(',');
      if (comma != 0) s.pushers.emplace(std::string(rest.substr(0, comma)));
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    }
  }
  const std::string id = ids.front();
  std::rotate(ids.begin(), ids.begin() + 1, ids.end());  // the handover's own id last
  from.adopted = std::move(ids);
  std::lock_guard lock(mu_);
  // The same handover again: its first reply was lost. Added once. Or one its giving server
  // recalled (and kept) before it came: not added.
  if (const auto it = keys_.find(name); it != keys_.end() && holds(it->second, id))
    return Message(param::ok_reply);
  if (refused_.contains(id)) {
    throw std::runtime_error("the handover " + id + " of '" + name +
                             "' came after its giving server took the key back: not added");
  }
  absorb(name, std::move(from));
  return Message(param::ok_reply);
}

Message ParamServerImpl::settle(const Message& request) {
  const auto epoch = param::number(request.text());
  std::lock_guard lock(mu_);
  if (epoch && *epoch == epoch_) {
    settled_ = true;
    for (auto& [name, key] : keys_) {
      key.provisional = false;
      answer_pulls(key);
    }
    for (auto& [name, pulls] : orphan_pulls_) {
      for (auto& [step, responder] : pulls) responder.fail("no key '" + name + "' on " + self_);
    }
    orphan_pulls_.clear();
  }
  return Message(param::ok_reply);
}

}  // namespace detail

ParamServer::ParamServer(std::shared_ptr<detail::ParamServerImpl> impl) : impl_(std::move(impl)) {}
ParamServer ParamServer::listen(const std::string& host_port, ParamServerOptions options) {
  return ParamServer(std::make_shared<detail::ParamServerImpl>(host_port, options));
}
std::string ParamServer::address() const {
  return impl_->address();
}
std::size_t ParamServer::keys() const {
  return impl_->keys();
}
void ParamServer::shutdown() {
  impl_->shutdown();
}

}  // namespace anview
