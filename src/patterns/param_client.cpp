#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "anview/param_server.hpp"
#include "base/random.hpp"
#include "base/timeouts.hpp"
#include "patterns/connection.hpp"
#include "patterns/param_protocol.hpp"

namespace anview {

namespace param = patterns::param;

namespace detail {

class ParamClientImpl {
 public:
  ParamClientImpl(std::vector<std::string> servers, ParamClientOptions options);

  // Calls `method` on the owner of `key`, following moved replies; returns the ok reply.
  Message call_owner(std::string_view key, const char* method, const Message& request);
  void change(const HashRing& next);
  // A copy under the lock: follow() replaces ring_ while other threads push.
  HashRing ring() const {
    std::lock_guard lock(mu_);
    return ring_;
  }
  // Names this client's pushes: a server counts one push of a step per pusher.
  const std::string& pusher() const { return pusher_; }

 private:
  RpcClient& client(const std::string& address);
  // Takes a ring a server sent if it is newer; false if it is not.
  bool follow(std::string_view ring_text);

  ParamClientOptions options_;
  std::chrono::milliseconds deadline_;
  mutable std::mutex mu_;
  std::uint64_t epoch_ = 1;
  // The last epoch this client announced in a change, which may have failed part way: servers
  // that learned it take no other ring under that number, so the next change uses a newer one.
  std::uint64_t announced_ = 1;
  HashRing ring_;
  std::map<std::string, RpcClient> clients_;
  const std::string pusher_ = std::to_string(base::random_u64());
};

ParamClientImpl::ParamClientImpl(std::vector<std::string> servers, ParamClientOptions options)
    : options_(options),
      deadline_(base::timeout_or_default(options.deadline)),
      ring_(std::move(servers), options.virtual_nodes) {
  if (ring_.servers().empty())
    throw Error(ErrorKind::usage, {.operation = "param client", .cause = "no server address"});
  // Epoch 1 is the ring every worker starts from; servers that have a newer one say so.
  const Message ring(param::ring_text(1, ring_));
  const std::vector<std::string> first = ring_.servers();  // follow() may replace ring_
  for (const auto& s : first) {
    const Message reply = client(s).call_sync(param::ring_method, ring, {.deadline = deadline_});
    follow(reply.text().substr(param::ok_reply.size()));
  }
}

RpcClient& ParamClientImpl::client(const std::string& address) {
  std::lock_guard lock(mu_);
  auto it = clients_.find(address);
  if (it == clients_.end()) it = clients_.emplace(address, RpcClient::connect(address)).first;
  return it->second;
}

bool ParamClientImpl::follow(std::string_view text) {
  auto state = param::parse_ring(text);
  if (!state)
    throw Error(ErrorKind::protocol,
                {.operation = "param client", .cause = "a server sent a malformed ring"});
  std::lock_guard lock(mu_);
  if (state->epoch <= epoch_) return false;
  epoch_ = state->epoch;
  ring_ = std::move(state->ring);
  return true;
}

Message ParamClientImpl::call_owner(std::string_view key, const char* method,
                                    const Message& request) {
  const auto end = std::chrono::steady_clock::now() + deadline_;
  for (;;) {
    std::string owner;
    {
      std::lock_guard lock(mu_);
      owner = ring_.owner(key);
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      throw Error(ErrorKind::timeout,
                  {.operation = std::string(method) + " '" + std::string(key) + "'",
                   .cause = "the key kept moving until the deadline"});
    Message reply = client(owner).call_sync(method, request, {.deadline = left});
    const auto text = reply.text();
    if (text.starts_with(param::ok_reply)) return reply;
    if (!text.starts_with(param::moved_reply))
      throw Error(ErrorKind::protocol, {.peer_address = owner,
                                        .operation = method,
                                        .cause = "an unknown reply from the server"});
    // The server has a newer ring: follow it. An older one: the server has not heard of ours
    // yet (a membership change in progress); ask again shortly.
    if (!follow(text.substr(param::moved_reply.size())))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void ParamClientImpl::change(const HashRing& next) {
  std::uint64_t epoch;
  std::vector<std::string> order;
  {
    std::lock_guard lock(mu_);
    epoch = std::max(epoch_, announced_) + 1;
    announced_ = epoch;
    // Servers that join hear of the ring first, then those that were there (and hand keys
    // over), then those that leave.
    const auto& old = ring_.servers();
    for (const auto& s : next.servers())
      if (std::find(old.begin(), old.end(), s) == old.end()) order.push_back(s);
    for (const auto& s : next.servers())
      if (std::find(old.begin(), old.end(), s) != old.end()) order.push_back(s);
    for (const auto& s : old)
      if (std::find(order.begin(), order.end(), s) == order.end()) order.push_back(s);
  }
  const Message ring(param::ring_text(epoch, next));
  for (const auto& s : order)
    client(s).call_sync(param::ring_method, ring, {.deadline = deadline_});
  const Message settle(std::to_string(epoch));
  for (const auto& s : order)
    client(s).call_sync(param::settle_method, settle, {.deadline = deadline_});
  std::lock_guard lock(mu_);
  if (epoch > epoch_) {
    epoch_ = epoch;
    ring_ = next;
  }
}

}  // namespace detail

namespace {

Message with_values(std::string header, const void* data, std::size_t count, DataType type) {
  Message m(header);
  m.add_tensor({.dtype = type, .shape = {static_cast<std::int64_t>(count)}, .data = data});
  return m;
}

void check_key(std::string_view key) {
  if (key.empty() || key.find('\n') != std::string_view::npos || key.size() > 1024)
    throw Error(ErrorKind::usage, {.operation = "param client",
                                   .cause = "a key is 1 to 1024 bytes without a newline"});
}

}  // namespace

ParamClient::ParamClient(std::shared_ptr<detail::ParamClientImpl> impl) : impl_(std::move(impl)) {}

ParamClient ParamClient::connect(std::vector<std::string> servers, ParamClientOptions options) {
  return ParamClient(std::make_shared<detail::ParamClientImpl>(std::move(servers), options));
}

void ParamClient::push(std::string_view key, const void* data, std::size_t count, DataType type,
                       std::uint64_t step) {
  check_key(key);
  impl_->call_owner(
      key, param::push_method,
      with_values(std::string(key) + "\n" + std::to_string(step) + "\n" + impl_->pusher() + "\n",
                  data, count, type));
}

void ParamClient::pull(std::string_view key, void* out, std::size_t count, DataType type,
                       std::uint64_t step) {
  check_key(key);
  const Message reply = impl_->call_owner(
      key, param::pull_method, Message(std::string(key) + "\n" + std::to_string(step) + "\n"));
  if (reply.tensors().size() != 1 || reply.tensors()[0].dtype != type ||
      reply.tensors()[0].bytes() != count * size_of(type))
    throw Error(ErrorKind::usage, {.operation = "pull '" + std::string(key) + "'",
                                   .cause = "the key does not hold " + std::to_string(count) + " " +
                                            std::string(name_of(type))});
  std::memcpy(out, reply.tensors()[0].data, count * size_of(type));
}

void ParamClient::set(std::string_view key, const void* data, std::size_t count, DataType type) {
  check_key(key);
  impl_->call_owner(key, param::set_method,
                    with_values(std::string(key) + "\n", data, count, type));
}

void ParamClient::add_server(const std::string& address) {
  HashRing next = impl_->ring();
  next.add(address);
  impl_->change(next);
}

void ParamClient::remove_server(const std::string& address) {
  HashRing next = impl_->ring();
  next.remove(address);
  impl_->change(next);
}

HashRing ParamClient::ring() const {
  return impl_->ring();
}

}  // namespace anview
