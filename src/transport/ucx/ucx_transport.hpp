// The UCX transport: frames travel as UCP active messages (transport/ucx/handshake.hpp) over
// whatever UCX picks for the peer — InfiniBand, RoCE or iWARP (rc, dc, ud), shared memory,
// TCP — with UCX's own rendezvous landing large payloads in the receive buffer.
//
// One UCP worker per transport (per communicator), driven by the progress engine: a poller
// calls ucp_worker_progress while the owner spins; before the owner may sleep the poller arms
// the worker (ucp_worker_arm), whose event fd is in the engine's epoll set. Endpoints are
// created from the worker addresses peers publish through the bootstrap store, and every
// endpoint starts with a hello naming job and rank. A peer's failure reaches us as UCX's
// endpoint error (err_mode PEER, keepalive at 1 s unless UCX_KEEPALIVE_INTERVAL says
// otherwise) or, on this host, as its process exiting (pidfd).
//
// Selection: UCX is worth it where it drives an RDMA device; there it serves the peers on
// other hosts, ahead of tcp. Elsewhere it serves no one unless ANVIEW_TRANSPORTS (set by the
// user) names it, and then UCX_TLS chooses its devices.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "transport/cross_memory.hpp"
#include "transport/transport.hpp"
#include "transport/ucx/connection.hpp"
#include "transport/ucx/worker.hpp"

namespace anview::transport::ucx {

class UcxTransport final : public Transport, public RemoteAccess, private base::FdHandler {
 public:
  // `forced`: the user named ucx in ANVIEW_TRANSPORTS, so it serves peers without RDMA too.
  UcxTransport(const TransportContext& context, bool forced);
  ~UcxTransport() override;

  std::string_view name() const override { return "ucx"; }
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
  // Same-host peers whose memory cross-memory attach reaches: collectives read it directly
  // and one-sided operations copy into it, as over shm.
  const PeerMemory* peer_memory(int peer) const override;
  bool whole_payloads(int peer) const override;
  // UCP's own RMA for the peers on other hosts (where same-host access does not serve them),
  // when ANVIEW_UCX_RMA says so: "native" always, "auto" where UCX drives an RDMA device (over
  // UCX's TCP its RMA is emulated by UCX itself and Anview's frames are much faster).
  RemoteAccess* remote_access(int peer) override;

  // RemoteAccess (transport.hpp): regions registered with ucp_mem_map, keys from
  // ucp_rkey_pack, put/get/flush with ucp_put_nbx, ucp_get_nbx and ucp_ep_flush_nbx.
  std::optional<std::string> expose(std::uint64_t token, void* data, std::size_t bytes,
                                    std::string* why) override;
  void conceal(std::uint64_t token) override;
  bool accept_key(int peer, std::uint64_t token, const std::string& packed,
                  std::string* why) override;
  void forget_key(int peer, std::uint64_t token) override;
  void put(int peer, std::uint64_t token, const void* local, std::size_t bytes,
           std::uint64_t remote, SendDone done) override;
  void get(int peer, std::uint64_t token, void* local, std::size_t bytes, std::uint64_t remote,
           SendDone done) override;
  void flush(int peer, SendDone done) override;

  // Whether ucx belongs in the default transport list here: UCX sees an RDMA device. Cheap
  // when the machine has no RDMA hardware at all (/sys/class/infiniband is empty).
  static bool rdma_present(std::string* detail);
  // What anview-info reports: the devices UCX sees, and why ucx is or is not used.
  static TransportProbe probe();

  // --- for Connection ---
  ucp_worker_h worker() const { return worker_->get(); }
  FrameSink& sink() { return *context_.sink; }
  int rank() const { return context_.rank; }
  bool closing() const { return closing_; }
  ErrorContext error_context(int peer, const std::string& operation) const;
  void on_endpoint_error(int peer, ucs_status_t status);
  // The link to `peer` cannot go on: closes it (once), quiesces it, and tells the sink. Inside
  // UCX's callbacks the last two wait for poll(), right after the worker's progress.
  void fail_link(int peer, const Error& error);

 private:
  struct PeerLink {
    std::unique_ptr<Connection> conn;
    std::optional<Error> setup_error;
    std::unique_ptr<PeerMemory> memory;  // same host, when cross-memory attach works
    bool whole_payloads = false;         // see whole_payloads()
  };

  static ucs_status_t on_am(void* arg, const void* header, std::size_t header_bytes, void* data,
                            std::size_t length, const ucp_am_recv_param_t* param);
  ucs_status_t on_frame(const void* header, std::size_t header_bytes, void* data,
                        std::size_t length, const ucp_am_recv_param_t& param);
  void on_hello(const void* header, std::size_t header_bytes);
  void on_goodbye(const void* header, std::size_t header_bytes);
  bool poll();
  void on_fd_events(std::uint32_t events) override;  // the worker's event fd
  void on_peer_process_exit(int peer);
  void setup_error(int peer, const std::string& cause);
  Error closed_communicator(int peer) const;  // the peer said goodbye
  Error closed_link(int peer) const;          // the peer closed its link to us
  Error closing_error() const;                // we are closing
  void reap_close_requests();
  void protocol_error(int peer, const std::string& cause);
  void progress_for(base::Deadline deadline, const std::function<bool()>& done);
  // ucp_worker_progress, noting that UCX's callbacks (and what they call) run inside it.
  unsigned progress_worker();
  // For a closed link: progresses until UCX has ended every send and receive of it (for a
  // peer that `peer_lives`, before the endpoint's forced close cancels what is left), so no
  // buffer of an operation the sink is about to fail is read or written afterwards. Never
  // inside UCX's callbacks.
  void quiesce(Connection& conn, bool peer_lives, base::Deadline deadline);
  // The failed links not yet told to the sink: quiesced, then told.
  void report_failures();
  Connection* link(int peer) const;

  TransportContext context_;
  bool forced_;
  std::uint32_t max_frame_;
  std::unique_ptr<Worker> worker_;
  std::string unusable_;  // why the transport cannot run here (empty: it can)
  std::vector<PeerLink> peers_;
  bool rdma_ = false;        // UCX drives an RDMA device here (rdma_present(), once)
  bool native_rma_ = false;  // remote_access() for peers on other hosts (ANVIEW_UCX_RMA)
  std::unordered_map<std::uint64_t, ucp_mem_h> exposed_;  // by region token
  std::vector<void*> close_requests_;
  struct Unreported {
    int peer;
    Error error;
    bool left;
  };
  std::vector<Unreported> unreported_;
  bool progressing_ = false;                      // inside ucp_worker_progress
  alignas(8) std::uint64_t probe_ = probe_value;  // read by same-host peers to test CMA
  unsigned idle_rounds_ = 0;
  bool armed_ = false;
  bool closing_ = false;
  bool attention_ = false;  // poll() has links to look at (goodbye, failure)
  bool logged_stray_ = false;
  bool logged_arm_failure_ = false;
};

}  // namespace anview::transport::ucx
