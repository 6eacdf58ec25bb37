// The shared-memory transport: ranks on the same host exchange frames through lock-free rings
// in shared memory (transport/shm/ring.hpp, handshake.hpp). Small payloads are copied through
// the ring; large ones are read by the receiver straight from the sender's buffer with
// cross-memory attach (process_vm_readv: one copy, into the posted receive buffer). Where the
// kernel refuses cross-memory attach, large payloads are pipelined through the ring in
// fragments instead; that is detected per peer at connection time and reported.
//
// Waiting: the progress engine polls the rings while its owner spins; before it sleeps in
// epoll it raises a flag in its segment, and a peer that gives it work sends a datagram to its
// wake-up socket (abstract unix namespace: nothing on the file system). An idle rank uses no
// CPU. A peer's death is seen through a pidfd at once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/cross_memory.hpp"
#include "transport/shm/connection.hpp"
#include "transport/transport.hpp"

namespace anview::transport::shm {

class ShmTransport final : public Transport, private base::FdHandler {
 public:
  explicit ShmTransport(const TransportContext& context);
  ~ShmTransport() override;

  std::string_view name() const override { return "shm"; }
  Capabilities capabilities() const override;
  void describe_self(PeerInfo& self) const override;
  bool can_reach(const PeerInfo& peer, std::string* why) const override;
  void connect(const std::vector<PeerInfo>& peers) override;
  bool ready() const override;
  std::optional<Error> setup_failure() const override;
  std::string pending_connections() const override;
  void post_send(int peer, const FrameHeader& header, const void* payload, Ordering ordering,
                 SendDone done) override;
  bool try_send_now(int peer, const FrameHeader& header, const void* payload) override;
  void resume(int peer) override;
  void fail_peer(int peer, const Error& error) override;
  void shutdown(base::Deadline deadline) override;
  std::string describe_peer(int peer) const override;
  const PeerMemory* peer_memory(int peer) const override;
  SharedArea own_area() override;
  const char* peer_area(int peer) const override;

  // Whether this machine lets the transport run at all (memfd, mmap, a wake-up socket).
  static bool usable_here(std::string* why);
  // What anview-info reports: usable or why not, single copy, ptrace restrictions.
  static TransportProbe probe();

  // --- for Connection ---
  FrameSink& sink() { return *context_.sink; }
  std::uint32_t max_frame() const { return max_frame_; }  // ANVIEW_MAX_FRAME
  int rank() const { return context_.rank; }
  int world_size() const { return context_.world_size; }
  int wake_socket() const { return wake_socket_.get(); }
  std::size_t single_copy_bytes() const { return single_copy_bytes_; }
  std::size_t split_bytes() const { return split_bytes_; }
  ErrorContext error_context(int peer, const std::string& operation) const;
  // The link to `peer` cannot go on: fails it (once) and tells the sink.
  void fail_link(int peer, const Error& error);
  bool closing() const { return closing_; }

 private:
  struct PeerLink {
    bool served = false;
    std::unique_ptr<Connection> conn;
    std::unique_ptr<PeerMemory> memory;  // when cross-memory attach works towards the peer
    std::optional<Error> setup_error;    // failed before it was up
    bool was_up = false;
    bool failed = false;
  };

  bool poll();
  bool has_work() const;  // lock-free hint for the spinning driver
  bool before_sleep();
  void after_wake();
  void on_fd_events(std::uint32_t events) override;  // the wake-up socket
  void on_peer_process_exit(int peer);
  void setup_error(int peer, const std::string& cause);
  Error closed_communicator(int peer) const;  // the peer said goodbye

  TransportContext context_;
  std::size_t ring_bytes_;
  std::uint32_t max_frame_;
  std::size_t single_copy_bytes_;
  bool single_copy_wanted_;
  std::size_t split_bytes_;
  std::string unusable_;  // why the transport cannot run here (empty: it can)
  base::Fd segment_;
  Mapping own_control_page_;
  Mapping own_area_;
  SegmentControl* own_control_ = nullptr;
  base::Fd wake_socket_;
  std::string wake_name_;
  alignas(8) std::uint64_t probe_ = probe_value;  // read by peers to test CMA
  std::vector<PeerLink> peers_;
  std::vector<Connection*> active_;  // connections the poller serves
  bool closing_ = false;
};

}  // namespace anview::transport::shm
