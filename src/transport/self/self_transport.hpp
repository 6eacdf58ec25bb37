// The self transport: frames a rank sends to itself, delivered in order by a progress poller
// (never inside post_send, so the sink is not re-entered).
#pragma once

#include <atomic>
#include <deque>
#include <optional>

#include "transport/transport.hpp"

namespace anview::transport::self {

class SelfTransport final : public Transport {
 public:
  explicit SelfTransport(const TransportContext& context);

  std::string_view name() const override { return "self"; }
  Capabilities capabilities() const override;
  void describe_self(PeerInfo&) const override {}
  bool can_reach(const PeerInfo& peer, std::string* why) const override;
  void connect(const std::vector<PeerInfo>&) override {}
  bool ready() const override { return true; }
  std::optional<Error> setup_failure() const override { return std::nullopt; }
  std::string pending_connections() const override { return {}; }
  void post_send(int peer, const FrameHeader& header, const void* payload, Ordering ordering,
                 SendDone done) override;
  void resume(int peer) override;
  // Closes the link to this rank itself (the messenger gives up on a send or receive to self
  // caught mid-transfer): queued frames are dropped, their senders told, and every pending
  // operation with this rank fails, so no frame still pointing at a buffer the caller got
  // back is delivered later. Sends after that fail at once.
  void fail_peer(int peer, const Error& error) override;
  void shutdown(base::Deadline) override;
  std::string describe_peer(int) const override { return "self (in-process copy)"; }

 private:
  struct Queued {
    FrameHeader header;
    const void* payload;
    SendDone done;
  };
  bool deliver();
  // Empties the queue, telling each frame's sender `error`.
  void drop_queued(const Error& error);

  TransportContext context_;
  std::deque<Queued> queue_;
  std::optional<Error> failure_;  // set by fail_peer
  bool paused_ = false;
  std::atomic<bool> pending_{false};  // frames to deliver (lock-free hint for the driver)
};

}  // namespace anview::transport::self
