// One peer of the ucx transport: its UCP endpoint, the frames sent to it that UCX still holds,
// and the frames it sent that wait for their turn (ordered frames UCX delivered early), for
// room (the sink deferred), or for connect() (they came before we knew the peer).
//
// Incoming payloads land without a bounce copy: UCX's rendezvous writes them straight into
// the sink's landing buffer (ucp_am_recv_data_nbx); small eager payloads are copied once from
// UCX's receive buffer, which is kept (UCS_INPROGRESS) while a frame waits.
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/process_watch.hpp"
#include "transport/transport.hpp"
#include "transport/ucx/handshake.hpp"

namespace anview::transport::ucx {

class UcxTransport;

class Connection {
 public:
  Connection(UcxTransport& owner, int peer);
  ~Connection();  // out of line: SendOp and RecvOp are complete only there
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  int peer() const { return peer_; }
  bool open() const { return ep_ != nullptr && !failed_; }
  bool served() const { return served_; }
  // Nothing it sent waits or lands here any more.
  bool quiet() const { return waiting_.empty() && receives_.empty(); }
  // "tcp/lo" or "posix/memory, cma/memory": the UCX transports of the endpoint's lanes.
  std::string transports() const;
  bool failed() const { return failed_; }
  bool hello_received() const { return hello_received_; }
  bool goodbye_received() const { return goodbye_received_; }
  std::size_t sends_in_flight() const { return sends_.size(); }
  std::size_t receives_in_flight() const { return receives_.size(); }
  // UCX holds no send or receive of this connection any more.
  bool settled() const { return sends_.empty() && receives_.empty(); }

  // Creates the endpoint from the peer's worker address (UCX connects lazily) and sends our
  // hello. False with the reason when UCX refuses the address. `watched`: the peer's process
  // is watched (same host), so the endpoint needs no UCX peer failure handling.
  bool connect(const std::string& worker_address, const Hello& hello, bool watched,
               std::string* why);
  void on_hello() { hello_received_ = true; }
  void on_goodbye() { goodbye_received_ = true; }

  void send(const FrameHeader& header, const void* payload, Ordering ordering, SendDone done);
  bool try_send_now(const FrameHeader& header, const void* payload);
  void say_goodbye(int own_rank);
  // After close(), once what we sent has ended: tells the peer we closed the link, so its
  // operations with us fail now instead of at their timeout (UCX does not tell it).
  void say_closed(int own_rank);
  void on_closed_by_peer() { closed_by_peer_ = true; }
  bool closed_by_peer() const { return closed_by_peer_; }

  // Native one-sided access (transport.hpp, RemoteAccess): the peer's packed keys, unpacked
  // on this endpoint, by region token; put/get/flush through UCP's RMA. Each completes through
  // `done` like a send, and fails like one when the endpoint fails.
  bool accept_key(std::uint64_t token, const std::string& packed, std::string* why);
  void forget_key(std::uint64_t token);
  void drop_keys();  // every key (before the worker goes; nothing may be using them)
  void rma(bool put, std::uint64_t token, void* local, std::size_t bytes, std::uint64_t remote,
           SendDone done);
  void flush(SendDone done);

  // An active message carrying a frame of this peer (inside ucp_worker_progress). Returns what
  // the UCX receive callback returns.
  ucs_status_t on_frame(const AmHeader& header, void* data, std::size_t length,
                        const ucp_am_recv_param_t& param);
  void resume();
  // The peer will send nothing more (it said goodbye or closed the link): what waits is
  // delivered now, past the sink's budget, so the link can end.
  void take_everything() {
    must_accept_ = true;
    resume();
  }

  // Fails everything waiting with `error`; sends in flight fail with it once the endpoint is
  // closed (close_endpoint(), outside UCX's callbacks).
  void close(const Error& error);
  // Closes a failed connection's endpoint without waiting for the peer; true if it did now.
  // UCX's request for that close, if any, goes to `requests` (the caller frees it once done).
  bool close_endpoint(std::vector<void*>& requests);
  // The transport is being destroyed, or UCX would not end them: completions still to come
  // call no one.
  void abandon();

  std::unique_ptr<base::ProcessWatch> exit_watch;

 private:
  struct Incoming {
    AmHeader header;
    enum class Data { none, transient, held, copied, rendezvous } kind = Data::none;
    void* data = nullptr;  // transient/held: UCX's data; rendezvous: its descriptor
    std::size_t length = 0;
    std::vector<char> copy;
  };
  struct SendOp;
  struct RecvOp;
  enum class Outcome { delivered, deferred, failed };

  static void send_done(void* request, ucs_status_t status, void* user_data);
  static void receive_done(void* request, ucs_status_t status, std::size_t length, void* user_data);
  SendOp* new_send(SendDone done);
  // UCX request parameters that complete `op` through send_done().
  static ucp_request_param_t completing(SendOp* op);
  // Finishes `op` if UCX did (or failed) at once; else send_done() will.
  void settle(SendOp* op, ucs_status_ptr_t request);
  // When the endpoint is not open: completes `done` with why, and returns true.
  bool refused_closed(const char* operation, const SendDone& done) const;
  void finish_send(SendOp* op, ucs_status_t status);
  void send_bye(std::uint32_t magic, int own_rank);
  ucs_status_ptr_t post(unsigned id, SendOp* op, std::size_t header_bytes, const void* payload,
                        std::size_t bytes, std::uint32_t flags);
  bool deliverable(const AmHeader& header) const;
  void drain();
  Outcome deliver(Incoming& in);
  void release(Incoming& in);
  Error link_error(const std::string& operation, const std::string& cause,
                   ErrorKind kind = ErrorKind::link) const;

  UcxTransport& owner_;
  const int peer_;
  ucp_ep_h ep_ = nullptr;
  bool served_ = false;
  bool failed_ = false;
  bool hello_received_ = false;
  bool goodbye_received_ = false;
  bool closed_by_peer_ = false;
  bool must_accept_ = false;  // see take_everything()
  std::optional<Error> error_;
  std::uint64_t next_send_seq_ = 0;
  std::uint64_t next_receive_seq_ = 0;
  bool ordered_busy_ = false;  // an ordered frame's rendezvous is still landing
  bool deferred_ = false;      // the sink has no room: stop until resume()
  bool draining_ = false;
  bool drain_again_ = false;
  std::list<Incoming> waiting_;
  Incoming* transient_ = nullptr;  // the frame of the current callback, while queued
  bool transient_handed_over_ = false;
  std::vector<std::unique_ptr<SendOp>> sends_;
  std::vector<std::unique_ptr<RecvOp>> receives_;
  std::unordered_map<std::uint64_t, ucp_rkey_h> rkeys_;
};

}  // namespace anview::transport::ucx
