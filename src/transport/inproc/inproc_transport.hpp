// The in-process transport: ranks that are threads of one process (tests, simulations)
// exchange frames through per-pair queues in memory, with no socket and no shared segment, so
// a test can run 64 ranks on two cores. Each rank's Inbox is found through a process-wide
// registry by the id it publishes at bootstrap.
//
// A frame's payload is copied when it is posted (the sender's buffer is free at once) and
// copied again where the receiver lands it. Completions and deliveries run on their owner's
// progress thread, under its lock, like every transport (transport.hpp); only the inboxes are
// shared between threads, under their own mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "transport/transport.hpp"

namespace anview::transport::inproc {

struct Inbox;

class InprocTransport final : public Transport {
 public:
  explicit InprocTransport(const TransportContext& context);
  ~InprocTransport() override;

  static TransportProbe probe();

  std::string_view name() const override { return "inproc"; }
  Capabilities capabilities() const override;
  void describe_self(PeerInfo& self) const override;
  bool can_reach(const PeerInfo& peer, std::string* why) const override;
  void connect(const std::vector<PeerInfo>& peers) override;
  // Every peer has found this rank's inbox too (so none leaves before the other connected).
  bool ready() const override;
  std::optional<Error> setup_failure() const override { return setup_failure_; }
  std::string pending_connections() const override;
  void post_send(int peer, const FrameHeader& header, const void* payload, Ordering ordering,
                 SendDone done) override;
  void resume(int peer) override;
  void fail_peer(int peer, const Error& error) override;
  void shutdown(base::Deadline deadline) override;
  std::string describe_peer(int peer) const override;

 private:
  bool progress();
  bool deliver_from(int peer);
  void peer_failed(int peer, const Error& error, bool left);

  TransportContext context_;
  std::shared_ptr<Inbox> inbox_;               // frames for this rank
  std::vector<std::shared_ptr<Inbox>> peers_;  // by rank: theirs (null: not served here)
  std::vector<bool> paused_;                   // by rank: the sink deferred its frames
  std::vector<bool> failed_;                   // by rank: its link is down
  std::deque<SendDone> completions_;           // sends handed over, to complete in progress()
  std::atomic<bool> completions_pending_{false};
  std::vector<int> expected_;  // the peers served here, each to say hello
  std::optional<Error> setup_failure_;
};

}  // namespace anview::transport::inproc
