#include "transport/inproc/inproc_transport.hpp"

#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>

namespace anview::transport::inproc {

// One rank's incoming frames, by sender; pushed by the senders' threads, taken by the owner's.
struct Inbox {
  struct Frame {
    FrameHeader header;
    std::vector<char> payload;
  };
  std::mutex mu;
  std::map<int, std::deque<Frame>> frames;  // by sender
  std::set<int> closed;                     // senders that left (their goodbye)
  std::set<int> connected;                  // senders that found this inbox (their hello)
  base::ProgressEngine* engine = nullptr;   // to wake the owner; null once it is gone
  std::atomic<bool> pending{false};         // something arrived (lock-free hint)

  void push(int from, Frame frame) {
    std::lock_guard lock(mu);
    frames[from].push_back(std::move(frame));
    pending.store(true, std::memory_order_release);
    if (engine != nullptr) engine->wakeup();
  }
  void hello(int from) {
    std::lock_guard lock(mu);
    connected.insert(from);
    if (engine != nullptr) engine->wakeup();
  }
  void goodbye(int from) {
    std::lock_guard lock(mu);
    closed.insert(from);
    pending.store(true, std::memory_order_release);
    if (engine != nullptr) engine->wakeup();
  }
};

namespace {

// The inboxes of this process's live transports, by the id each publishes.
struct Registry {
  std::mutex mu;
  std::uint64_t next_id = 1;
  std::map<std::uint64_t, std::weak_ptr<Inbox>> inboxes;
  std::map<const Inbox*, std::uint64_t> ids;
};
Registry& registry() {
  static Registry r;
  return r;
}

std::string endpoint_of(std::uint64_t id) {
  return std::to_string(::getpid()) + ":" + std::to_string(id);
}

}  // namespace

InprocTransport::InprocTransport(const TransportContext& context)
    : context_(context),
      inbox_(std::make_shared<Inbox>()),
      peers_(static_cast<std::size_t>(context.world_size)),
      paused_(static_cast<std::size_t>(context.world_size), false),
      failed_(static_cast<std::size_t>(context.world_size), false) {
  inbox_->engine = context_.engine;
  {
    auto& r = registry();
    std::lock_guard lock(r.mu);
    const std::uint64_t id = r.next_id++;
    r.inboxes[id] = inbox_;
    r.ids[inbox_.get()] = id;
  }
  context_.engine->add_poller([this] { return progress(); },
                              [this] {
                                return inbox_->pending.load(std::memory_order_acquire) ||
                                       completions_pending_.load(std::memory_order_acquire);
                              });
}

InprocTransport::~InprocTransport() {
  {
    std::lock_guard lock(inbox_->mu);
    inbox_->engine = nullptr;
  }
  auto& r = registry();
  std::lock_guard lock(r.mu);
  const auto it = r.ids.find(inbox_.get());
  if (it != r.ids.end()) {
    r.inboxes.erase(it->second);
    r.ids.erase(it);
  }
}

TransportProbe InprocTransport::probe() {
  return TransportProbe{.name = "inproc",
                        .usable = true,
                        .detail = "ranks that are threads of one process, through memory"};
}

Capabilities InprocTransport::capabilities() const {
  return Capabilities{.zero_copy_receive = false,
                      .one_sided = false,
                      .streams = 1,
                      .latency_us = 0.5,
                      .bandwidth_gbs = 5.0};
}

void InprocTransport::describe_self(PeerInfo& self) const {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  self.endpoints["inproc"] = endpoint_of(r.ids.at(inbox_.get()));
}

bool InprocTransport::can_reach(const PeerInfo& peer, std::string* why) const {
  const auto it = peer.endpoints.find("inproc");
  if (it == peer.endpoints.end()) {
    if (why) *why = "the peer does not offer it";
    return false;
  }
  if (it->second.rfind(std::to_string(::getpid()) + ":", 0) != 0) {
    if (why) *why = "the peer is another process";
    return false;
  }
  return true;
}

void InprocTransport::connect(const std::vector<PeerInfo>& peers) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  for (const auto& p : peers) {
    const std::string& endpoint = p.endpoints.at("inproc");
    const std::uint64_t id = std::stoull(endpoint.substr(endpoint.find(':') + 1));
    const auto it = r.inboxes.find(id);
    std::shared_ptr<Inbox> inbox = it == r.inboxes.end() ? nullptr : it->second.lock();
    if (inbox == nullptr) {
      setup_failure_ = Error(
          ErrorKind::peer_lost,
          {.rank = context_.rank,
           .peer = p.rank,
           .operation = "inproc.connect",
           .cause = "its communicator is gone from this process (endpoint " + endpoint + ")"});
      continue;
    }
    inbox->hello(context_.rank);
    expected_.push_back(p.rank);
    peers_.at(static_cast<std::size_t>(p.rank)) = std::move(inbox);
  }
}

bool InprocTransport::ready() const {
  if (setup_failure_) return true;
  std::lock_guard lock(inbox_->mu);
  for (int p : expected_)
    if (inbox_->connected.count(p) == 0) return false;
  return true;
}

std::string InprocTransport::pending_connections() const {
  std::string missing;
  std::lock_guard lock(inbox_->mu);
  for (int p : expected_)
    if (inbox_->connected.count(p) == 0)
      missing += (missing.empty() ? "rank " : ", rank ") + std::to_string(p);
  return missing.empty() ? missing : "not yet connected by " + missing;
}

void InprocTransport::post_send(int peer, const FrameHeader& header, const void* payload, Ordering,
                                SendDone done) {
  const auto p = static_cast<std::size_t>(peer);
  if (failed_[p] || peers_[p] == nullptr) {
    const Error error(ErrorKind::link, {.rank = context_.rank,
                                        .peer = peer,
                                        .operation = "send",
                                        .cause = "the in-process link to this rank is down"});
    if (done) done(&error);
    return;
  }
  Inbox::Frame frame{header, {}};
  if (header.payload_bytes > 0) {
    const auto* bytes = static_cast<const char*>(payload);
    frame.payload.assign(bytes, bytes + header.payload_bytes);
  }
  peers_[p]->push(context_.rank, std::move(frame));
  // Completed in progress(), not here: the sink is not re-entered from inside post_send.
  completions_.push_back(std::move(done));
  completions_pending_.store(true, std::memory_order_release);
  context_.engine->wakeup();
}

bool InprocTransport::progress() {
  bool worked = false;
  while (!completions_.empty()) {
    SendDone done = std::move(completions_.front());
    completions_.pop_front();
    if (done) done(nullptr);
    worked = true;
  }
  completions_pending_.store(false, std::memory_order_release);
  if (!inbox_->pending.exchange(false, std::memory_order_acq_rel)) return worked;
  std::vector<int> senders, gone;
  {
    std::lock_guard lock(inbox_->mu);
    for (const auto& [from, queue] : inbox_->frames)
      if (!queue.empty()) senders.push_back(from);
    gone.assign(inbox_->closed.begin(), inbox_->closed.end());
  }
  for (int from : senders) worked = deliver_from(from) || worked;
  for (int from : gone) {
    bool drained;
    {
      std::lock_guard lock(inbox_->mu);
      drained = inbox_->frames[from].empty();
    }
    if (drained && !failed_[static_cast<std::size_t>(from)]) {
      peer_failed(from,
                  Error(ErrorKind::peer_lost,
                        {.rank = context_.rank,
                         .peer = from,
                         .operation = "transfer",
                         .cause = "rank " + std::to_string(from) + " closed its communicator"}),
                  true);
      worked = true;
    }
  }
  return worked;
}

// Hands `from`'s queued frames to the sink, in order, until it defers one.
bool InprocTransport::deliver_from(int from) {
  const auto f = static_cast<std::size_t>(from);
  bool worked = false;
  while (!paused_[f]) {
    Inbox::Frame frame;
    {
      std::lock_guard lock(inbox_->mu);
      auto& queue = inbox_->frames[from];
      if (queue.empty()) break;
      frame = std::move(queue.front());
      queue.pop_front();
    }
    const Landing landing = context_.sink->on_frame(from, frame.header, true);
    if (landing.defer) {
      std::lock_guard lock(inbox_->mu);
      inbox_->frames[from].push_front(std::move(frame));
      paused_[f] = true;
      break;
    }
    if (!frame.payload.empty() && landing.data != nullptr)
      std::memcpy(landing.data, frame.payload.data(), frame.payload.size());
    if (landing.data != nullptr || frame.header.payload_bytes == 0)
      context_.sink->on_frame_done(from, frame.header, landing.data);
    worked = true;
  }
  return worked;
}

void InprocTransport::resume(int peer) {
  paused_[static_cast<std::size_t>(peer)] = false;
  inbox_->pending.store(true, std::memory_order_release);
  context_.engine->wakeup();
}

void InprocTransport::peer_failed(int peer, const Error& error, bool left) {
  failed_[static_cast<std::size_t>(peer)] = true;
  context_.sink->on_peer_failed(peer, error, left);
}

void InprocTransport::fail_peer(int peer, const Error& error) {
  if (failed_[static_cast<std::size_t>(peer)]) return;
  peer_failed(peer, error, false);
}

void InprocTransport::shutdown(base::Deadline) {
  for (std::size_t p = 0; p < peers_.size(); ++p)
    if (peers_[p] != nullptr && !failed_[p]) peers_[p]->goodbye(context_.rank);
  progress();  // completes the sends handed over
  peers_.assign(peers_.size(), nullptr);
}

std::string InprocTransport::describe_peer(int peer) const {
  return "inproc (rank " + std::to_string(peer) + ", a thread of this process)";
}

}  // namespace anview::transport::inproc
