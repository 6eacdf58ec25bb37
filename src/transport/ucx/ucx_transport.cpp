#include "transport/ucx/ucx_transport.hpp"

#include <cstring>
#include <filesystem>
#include <thread>

#include "base/config.hpp"
#include "base/limits.hpp"
#include "base/log.hpp"

namespace anview::transport::ucx {
namespace {

// Rounds of ucp_worker_progress that find nothing before the worker is armed for sleeping:
// arming makes senders signal us (a system call per message on shared memory), so a waiter
// that is about to be answered spins a little first.
constexpr unsigned arm_after_idle_rounds = 1024;

// How long closing a link waits for UCX to end the link's sends and receives (a forced close
// cancels them at once; this bounds a UCX that does not).
constexpr auto quiesce_limit = std::chrono::seconds(2);

const base::Setting rma_setting(
    "ucx", "ANVIEW_UCX_RMA", "auto",
    "One-sided put/get to peers on other hosts over ucx: native (UCP RMA on memory registered "
    "with UCX), frames (active messages served by the owner's progress), or auto (native where "
    "UCX drives an RDMA device)");

bool native_rma_wanted(bool rdma) {
  const std::string mode = rma_setting.value();
  if (mode == "native") return true;
  if (mode == "frames") return false;
  if (mode == "auto") return rdma;
  throw Error(ErrorKind::usage,
              {.operation = "configure",
               .cause = "ANVIEW_UCX_RMA=" + mode + " is not one of native, frames, auto"});
}

template <typename T>
bool read_header(const void* header, std::size_t header_bytes, T& out) {
  if (header_bytes != sizeof(T) || header == nullptr) return false;
  std::memcpy(&out, header, sizeof(T));
  return true;
}

std::string join(const std::vector<std::string>& items, std::size_t most) {
  std::string text;
  for (std::size_t i = 0; i < items.size() && i < most; ++i)
    text += (i == 0 ? "" : ", ") + items[i];
  if (items.size() > most) text += ", ... (" + std::to_string(items.size()) + " in all)";
  return text;
}

}  // namespace

bool UcxTransport::rdma_present(std::string* detail) {
  // Every RDMA device UCX can drive (InfiniBand, RoCE, iWARP) is an RDMA core device: no
  // entry here, no need to open UCX's memory domains to know.
  std::error_code ec;
  const std::filesystem::path sys("/sys/class/infiniband");
  if (!std::filesystem::exists(sys, ec) || std::filesystem::is_empty(sys, ec)) {
    if (detail) *detail = "no RDMA device (/sys/class/infiniband is empty)";
    return false;
  }
  const DeviceReport& report = devices();
  if (!report.error.empty()) {
    if (detail) *detail = report.error;
    return false;
  }
  if (report.rdma.empty()) {
    if (detail) *detail = "UCX reports no rc, dc or ud transport on the RDMA devices";
    return false;
  }
  if (detail) *detail = "RDMA: " + join(report.rdma, 6);
  return true;
}

TransportProbe UcxTransport::probe() {
  TransportProbe p{.name = "ucx"};
  const DeviceReport& report = devices();
  const std::string version = std::string("UCX ") + ucp_get_version_string();
  if (!report.error.empty()) {
    p.detail = version + " cannot list its devices: " + report.error;
    return p;
  }
  p.usable = true;
  std::string rdma;
  const bool with_rdma = rdma_present(&rdma);
  p.detail = version + "; " + (with_rdma ? rdma : "no RDMA device") +
             "; other transports: " + (report.other.empty() ? "none" : join(report.other, 8));
  if (with_rdma) {
    p.notes.push_back(
        "used for peers on other hosts, ahead of tcp (in the default ANVIEW_TRANSPORTS)");
  } else {
    p.notes.push_back(
        "not used by default: without RDMA, UCX would carry TCP or shared memory, which "
        "Anview's own tcp and shm transports serve better; ANVIEW_TRANSPORTS=ucx forces it");
  }
  const char* tls = std::getenv("UCX_TLS");
  p.notes.push_back(std::string("UCX_TLS=") + (tls ? tls : "all (unset)") +
                    " is passed to UCX unchanged");
  return p;
}

UcxTransport::UcxTransport(const TransportContext& context, bool forced)
    : context_(context),
      forced_(forced),
      max_frame_(base::limits::max_frame_bytes()),
      worker_(std::make_unique<Worker>()),
      peers_(static_cast<std::size_t>(context.world_size)),
      rdma_(rdma_present(nullptr)),
      native_rma_(native_rma_wanted(rdma_)) {
  if (!worker_->valid()) {
    unusable_ = worker_->error();
    return;
  }
  for (int r = 0; r < context.world_size; ++r)
    if (r != context.rank)
      peers_[static_cast<std::size_t>(r)].conn = std::make_unique<Connection>(*this, r);
  for (const unsigned id : {unsigned{am_frame}, unsigned{am_hello}, unsigned{am_bye}}) {
    ucp_am_handler_param_t param{};
    param.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                       UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    param.id = id;
    param.flags = UCP_AM_FLAG_WHOLE_MSG | UCP_AM_FLAG_PERSISTENT_DATA;
    param.cb = &UcxTransport::on_am;
    param.arg = this;
    const ucs_status_t status = ucp_worker_set_am_recv_handler(worker_->get(), &param);
    if (status != UCS_OK) {
      unusable_ = "ucp_worker_set_am_recv_handler: " + status_text(status);
      return;
    }
  }
  context_.engine->add_fd(worker_->event_fd(), EPOLLIN, this);
  context_.engine->add_poller([this] { return poll(); });
}

UcxTransport::~UcxTransport() {
  if (!worker_->valid()) return;
  if (unusable_.empty()) context_.engine->remove_fd(worker_->event_fd());
  closing_ = true;
  const Error closed = closing_error();
  for (auto& link : peers_) {
    if (!link.conn) continue;
    link.conn->abandon();
    link.conn->close(closed);
    link.conn->close_endpoint(close_requests_);
  }
  const base::Deadline deadline = base::Clock::now() + std::chrono::seconds(2);
  while (!close_requests_.empty() && base::Clock::now() < deadline) {
    if (progress_worker() == 0) std::this_thread::yield();
    reap_close_requests();
  }
  for (void* request : close_requests_) ucp_request_free(request);
  close_requests_.clear();
  for (auto& link : peers_)
    if (link.conn) link.conn->drop_keys();
  for (auto& [token, memh] : exposed_) ucp_mem_unmap(worker_->context(), memh);
  exposed_.clear();
  worker_.reset();  // before the connections: UCX calls back into them until here
}

Capabilities UcxTransport::capabilities() const {
  const bool rdma = rdma_;
  return Capabilities{.zero_copy_receive = true,
                      .one_sided = false,
                      .streams = 1,
                      .fd_driven = false,
                      .latency_us = rdma ? 2.0 : 6.0,
                      .bandwidth_gbs = rdma ? 10.0 : 3.0};
}

void UcxTransport::describe_self(PeerInfo& self) const {
  if (!unusable_.empty()) return;
  self.endpoints["ucx"] =
      encode_endpoint(Endpoint{.worker_address = worker_->address(),
                               .probe_address = reinterpret_cast<std::uint64_t>(&probe_)});
}

bool UcxTransport::can_reach(const PeerInfo& peer, std::string* why) const {
  auto say = [why](std::string text) {
    if (why) *why = std::move(text);
    return false;
  };
  if (!unusable_.empty()) return say("not usable here: " + unusable_);
  const auto it = peer.endpoints.find("ucx");
  if (it == peer.endpoints.end()) return say("it does not offer ucx");
  Endpoint endpoint;
  if (!decode_endpoint(it->second, endpoint, why)) return false;
  if (forced_) return true;
  if (!rdma_) {
    return say(
        "no RDMA device: UCX would carry TCP or shared memory, which tcp and shm do "
        "better (ANVIEW_TRANSPORTS=ucx forces it)");
  }
  if (peer.host_id == context_.host_id) return say("on this host (shared memory serves it)");
  return true;
}

ErrorContext UcxTransport::error_context(int peer, const std::string& operation) const {
  return ErrorContext{
      .rank = context_.rank, .peer = peer, .peer_address = "ucx", .operation = operation};
}

Connection* UcxTransport::link(int peer) const {
  if (peer < 0 || static_cast<std::size_t>(peer) >= peers_.size()) return nullptr;
  return peers_[static_cast<std::size_t>(peer)].conn.get();
}

void UcxTransport::setup_error(int peer, const std::string& cause) {
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  if (link.setup_error) return;
  ErrorContext ctx = error_context(peer, "connect");
  ctx.cause = "cannot connect to rank " + std::to_string(peer) + " over UCX: " + cause;
  link.setup_error = Error(ErrorKind::link, std::move(ctx));
  base::log("ucx", base::LogLevel::error, link.setup_error->what());
  if (link.conn) {
    link.conn->close(*link.setup_error);
    link.conn->close_endpoint(close_requests_);
  }
}

void UcxTransport::connect(const std::vector<PeerInfo>& peers) {
  Hello hello;
  hello.job_id = context_.job_id;
  hello.rank = static_cast<std::uint32_t>(context_.rank);
  hello.world_size = static_cast<std::uint32_t>(context_.world_size);
  // UCX pipelines a large transfer over shared memory or RDMA itself: one rendezvous per
  // payload (per 1 MiB chunk cost 6 % of the 16 MiB bandwidth over sm). Over its TCP,
  // several chunks in flight beat one rendezvous of the whole.
  const bool whole_on_host = tls_allows_shared_memory(worker_->tls());
  const bool whole_across_hosts = rdma_ && tls_allows_rdma(worker_->tls());
  for (const auto& peer : peers) {
    PeerLink& link = peers_[static_cast<std::size_t>(peer.rank)];
    Endpoint endpoint;
    std::string why;
    if (!decode_endpoint(peer.endpoints.at("ucx"), endpoint, &why)) {
      setup_error(peer.rank, why);
      continue;
    }
    const bool same_host = peer.host_id == context_.host_id && peer.pid > 0;
    link.whole_payloads = same_host ? whole_on_host : whole_across_hosts;
    if (same_host) {
      const int rank = peer.rank;
      bool gone = false;
      link.conn->exit_watch = base::ProcessWatch::start(
          *context_.engine, peer.pid, [this, rank] { on_peer_process_exit(rank); }, &why, &gone);
      if (gone) {
        setup_error(rank, "its process (pid " + std::to_string(peer.pid) + ") has exited");
        continue;
      }
    }
    if (!link.conn->connect(endpoint.worker_address, hello, link.conn->exit_watch != nullptr,
                            &why)) {
      setup_error(peer.rank, why);
      continue;
    }
    if (same_host) {
      if (probe_cross_memory_attach(peer.pid, endpoint.probe_address, &why)) {
        link.memory = std::make_unique<CrossMemoryAccess>(context_.rank, peer.rank, peer.pid);
      } else {
        base::log("ucx", base::LogLevel::info, "ucx: rank ", context_.rank, " -> rank ", peer.rank,
                  ": no direct access to its memory: ", why);
      }
    }
    base::log("ucx", base::LogLevel::debug, "ucx: rank ", context_.rank, " -> rank ", peer.rank,
              ": ", describe_peer(peer.rank));
  }
}

bool UcxTransport::ready() const {
  for (const auto& link : peers_) {
    if (!link.conn || !link.conn->served()) continue;
    if (!link.conn->failed() && !link.conn->hello_received()) return false;
  }
  return true;
}

std::optional<Error> UcxTransport::setup_failure() const {
  for (const auto& link : peers_)
    if (link.setup_error) return link.setup_error;
  return std::nullopt;
}

std::string UcxTransport::pending_connections() const {
  std::string text;
  for (std::size_t r = 0; r < peers_.size(); ++r) {
    const PeerLink& link = peers_[r];
    if (!link.conn || !link.conn->served() || link.conn->failed() || link.conn->hello_received())
      continue;
    if (!text.empty()) text += ", ";
    text += "rank " + std::to_string(r) + " (ucx: no hello from it yet)";
  }
  return text;
}

void UcxTransport::post_send(int peer, const FrameHeader& header, const void* payload,
                             Ordering ordering, SendDone done) {
  link(peer)->send(header, payload, ordering, std::move(done));
}

bool UcxTransport::try_send_now(int peer, const FrameHeader& header, const void* payload) {
  return link(peer)->try_send_now(header, payload);
}

void UcxTransport::resume(int peer) {
  if (Connection* conn = link(peer)) conn->resume();
}

ucs_status_t UcxTransport::on_am(void* arg, const void* header, std::size_t header_bytes,
                                 void* data, std::size_t length, const ucp_am_recv_param_t* param) {
  // One callback for the three ids: the header sizes differ, and a frame header is the only
  // one of 48 bytes.
  auto* self = static_cast<UcxTransport*>(arg);
  if (header_bytes == sizeof(AmHeader))
    return self->on_frame(header, header_bytes, data, length, *param);
  if (header_bytes == sizeof(Hello)) {
    self->on_hello(header, header_bytes);
  } else if (header_bytes == sizeof(Bye)) {
    self->on_goodbye(header, header_bytes);
  } else if (!self->logged_stray_) {
    self->logged_stray_ = true;
    base::log("ucx", base::LogLevel::warn, "ucx: rank ", self->context_.rank,
              " dropped an active message with a header of ", header_bytes,
              " bytes (not Anview's); further ones are dropped silently");
  }
  return UCS_OK;
}

ucs_status_t UcxTransport::on_frame(const void* header, std::size_t header_bytes, void* data,
                                    std::size_t length, const ucp_am_recv_param_t& param) {
  AmHeader h;
  read_header(header, header_bytes, h);
  Connection* conn = link(static_cast<int>(h.source));
  if (conn == nullptr) {
    if (!logged_stray_) {
      logged_stray_ = true;
      base::log("ucx", base::LogLevel::warn, "ucx: rank ", context_.rank,
                " dropped a frame claiming to come from rank ", h.source, " of ",
                context_.world_size, "; further ones are dropped silently");
    }
    return UCS_OK;
  }
  const int peer = static_cast<int>(h.source);
  if (h.frame.reserved != 0) {
    protocol_error(peer, "a frame header with reserved field " + std::to_string(h.frame.reserved));
    return UCS_OK;
  }
  if (h.frame.payload_bytes != length) {
    protocol_error(peer, "a frame header announcing " + std::to_string(h.frame.payload_bytes) +
                             " bytes arrived with " + std::to_string(length));
    return UCS_OK;
  }
  if (h.frame.payload_bytes > max_frame_) {
    protocol_error(peer, "a frame of " + std::to_string(h.frame.payload_bytes) +
                             " bytes, above ANVIEW_MAX_FRAME (" + std::to_string(max_frame_) + ")");
    return UCS_OK;
  }
  return conn->on_frame(h, data, length, param);
}

void UcxTransport::on_hello(const void* header, std::size_t header_bytes) {
  Hello hello;
  read_header(header, header_bytes, hello);
  const std::string problem =
      check_hello(hello, context_.job_id, context_.world_size, context_.rank);
  if (problem.empty()) {
    link(static_cast<int>(hello.rank))->on_hello();
    return;
  }
  // A hello of this job from a known rank that speaks another version: that rank cannot be
  // reached, say so; anything else is not ours and is ignored (logged once).
  if (hello.magic == hello_magic && hello.job_id == context_.job_id &&
      link(static_cast<int>(hello.rank)) != nullptr) {
    setup_error(static_cast<int>(hello.rank), "its hello was refused: " + problem);
  } else if (!logged_stray_) {
    logged_stray_ = true;
    base::log("ucx", base::LogLevel::warn, "ucx: rank ", context_.rank,
              " ignored a hello: ", problem);
  }
}

void UcxTransport::on_goodbye(const void* header, std::size_t header_bytes) {
  Bye bye;
  read_header(header, header_bytes, bye);
  const bool closed = bye.magic == close_magic;
  Connection* conn =
      bye.magic == hello_magic || closed ? link(static_cast<int>(bye.rank)) : nullptr;
  if (conn == nullptr) return;
  if (closed) {
    conn->on_closed_by_peer();
  } else {
    conn->on_goodbye();
  }
  attention_ = true;
}

void UcxTransport::protocol_error(int peer, const std::string& cause) {
  ErrorContext ctx = error_context(peer, "receive");
  ctx.cause = "rank " + std::to_string(peer) + " sent " + cause;
  fail_link(peer, Error(ErrorKind::protocol, std::move(ctx)));
}

void UcxTransport::on_endpoint_error(int peer, ucs_status_t status) {
  // Inside ucp_worker_progress: the link fails now, poll() closes it after progress.
  Connection* conn = link(peer);
  if (conn == nullptr || conn->failed()) return;
  if (conn->goodbye_received()) {
    fail_link(peer, closed_communicator(peer));
    return;
  }
  ErrorContext ctx = error_context(peer, conn->hello_received() ? "transfer" : "connect");
  ctx.cause = "UCX reports the endpoint to rank " + std::to_string(peer) +
              " failed: " + status_text(status) + " (the rank died or its link broke)";
  fail_link(peer, Error(ErrorKind::peer_lost, std::move(ctx)));
}

Error UcxTransport::closed_communicator(int peer) const {
  ErrorContext ctx = error_context(peer, "transfer");
  ctx.cause = "rank " + std::to_string(peer) + " closed its communicator";
  return Error(ErrorKind::peer_lost, std::move(ctx));
}

Error UcxTransport::closed_link(int peer) const {
  ErrorContext ctx = error_context(peer, "transfer");
  ctx.cause = "rank " + std::to_string(peer) +
              " closed its link to this rank (after a failure of its own there)";
  return Error(ErrorKind::peer_lost, std::move(ctx));
}

Error UcxTransport::closing_error() const {
  return Error(ErrorKind::link,
               {.rank = context_.rank, .operation = "send", .cause = "communicator closed"});
}

void UcxTransport::on_peer_process_exit(int peer) {
  Connection* conn = link(peer);
  if (conn == nullptr || conn->failed()) return;
  // Whatever it sent before it died may still be in UCX's queues: take it first.
  for (int i = 0; i < 16 && progress_worker() > 0; ++i) {
  }
  if (conn->failed()) return;
  if (conn->goodbye_received()) {
    fail_link(peer, closed_communicator(peer));
    return;
  }
  ErrorContext ctx = error_context(peer, conn->hello_received() ? "transfer" : "connect");
  ctx.cause = "the process of rank " + std::to_string(peer) +
              " exited without closing its communicator: it was killed or crashed";
  fail_link(peer, Error(ErrorKind::peer_lost, std::move(ctx)));
}

void UcxTransport::fail_link(int peer, const Error& error) {
  Connection* conn = link(peer);
  if (conn == nullptr || conn->failed()) return;
  PeerLink& l = peers_[static_cast<std::size_t>(peer)];
  if (!conn->hello_received() && !l.setup_error) l.setup_error = error;
  const bool left = conn->goodbye_received();
  const bool quiet = closing_ || left;
  base::log("ucx", quiet ? base::LogLevel::debug : base::LogLevel::error,
            quiet ? "ucx: link closed: " : "", error.what());
  conn->close(error);
  attention_ = true;
  if (closing_) return;  // shutdown() quiesces every link
  unreported_.push_back(Unreported{.peer = peer, .error = error, .left = left});
  // Inside UCX's callbacks, which cannot progress the worker, poll() does it right after.
  if (!progressing_) report_failures();
}

void UcxTransport::report_failures() {
  while (!unreported_.empty()) {
    std::vector<Unreported> failures;
    failures.swap(unreported_);
    for (const Unreported& f : failures) {
      quiesce(*link(f.peer), f.error.kind() != ErrorKind::peer_lost,
              base::Clock::now() + quiesce_limit);
      if (!closing_) context_.sink->on_peer_failed(f.peer, f.error, f.left);
    }
  }
}

unsigned UcxTransport::progress_worker() {
  progressing_ = true;
  const unsigned events = ucp_worker_progress(worker_->get());
  progressing_ = false;
  return events;
}

void UcxTransport::quiesce(Connection& conn, bool peer_lives, base::Deadline deadline) {
  auto progress_until_settled = [&] {
    while (!conn.settled() && base::Clock::now() < deadline) {
      if (progress_worker() == 0) std::this_thread::yield();
    }
  };
  // A live peer may still be reading our buffers (UCX's rendezvous gets them from here) and
  // writing into our receive buffers: let those transfers end first. UCX cannot cancel a
  // receive landing through ucp_am_recv_data_nbx, and a forced close cancels a send here
  // while the peer may still read its buffer.
  if (peer_lives) {
    // Told first: the peer then takes whatever of ours it had held back (past its budget),
    // which ends our sends, and fails the link when all has landed.
    conn.say_closed(context_.rank);
    progress_until_settled();
  }
  conn.close_endpoint(close_requests_);  // forced: UCX fails what is left
  progress_until_settled();
  if (conn.settled()) return;
  base::log("ucx", base::LogLevel::error, "ucx: rank ", context_.rank, " closed its link to rank ",
            conn.peer(), " but UCX still holds ", conn.sends_in_flight(), " sends and ",
            conn.receives_in_flight(),
            " receives of it; their completions are ignored, and UCX may still touch "
            "their buffers");
  conn.abandon();
}

void UcxTransport::fail_peer(int peer, const Error& error) {
  fail_link(peer, error);
}

void UcxTransport::reap_close_requests() {
  for (std::size_t i = 0; i < close_requests_.size();) {
    if (ucp_request_check_status(close_requests_[i]) == UCS_INPROGRESS) {
      ++i;
      continue;
    }
    ucp_request_free(close_requests_[i]);
    close_requests_[i] = close_requests_.back();
    close_requests_.pop_back();
  }
}

bool UcxTransport::poll() {
  const unsigned events = progress_worker();
  bool worked = events > 0;
  if (!unreported_.empty()) {
    report_failures();
    worked = true;
  }
  if (attention_) {  // a goodbye came or a link failed: look at every link once
    attention_ = false;
    for (auto& l : peers_) {
      Connection* conn = l.conn.get();
      if (conn == nullptr) continue;
      // The peer said goodbye (or that it closed the link) and everything it sent before has
      // landed.
      if (!conn->failed() && (conn->goodbye_received() || conn->closed_by_peer())) {
        if (conn->quiet()) {
          fail_link(conn->peer(), conn->goodbye_received() ? closed_communicator(conn->peer())
                                                           : closed_link(conn->peer()));
        } else {
          conn->take_everything();
          attention_ = true;  // again next round
        }
        worked = true;
      }
      if (conn->failed() && conn->close_endpoint(close_requests_))
        worked = true;  // a setup failure
    }
  }
  if (!close_requests_.empty()) reap_close_requests();
  if (worked) {
    idle_rounds_ = 0;
    armed_ = false;
    return true;
  }
  if (armed_) return false;
  if (++idle_rounds_ < arm_after_idle_rounds) return true;
  const ucs_status_t status = ucp_worker_arm(worker_->get());
  if (status == UCS_ERR_BUSY) {  // events came meanwhile
    idle_rounds_ = 0;
    return true;
  }
  if (status != UCS_OK) {
    if (!logged_arm_failure_) {
      logged_arm_failure_ = true;
      base::log("ucx", base::LogLevel::warn, "ucx: rank ", context_.rank,
                " cannot arm its UCX worker for sleeping (", status_text(status),
                "): waiting threads keep polling UCX instead of sleeping");
    }
    idle_rounds_ = 0;
    return true;
  }
  armed_ = true;
  return false;
}

void UcxTransport::on_fd_events(std::uint32_t) {
  armed_ = false;  // the poller, right after, progresses and re-arms before the next sleep
  idle_rounds_ = arm_after_idle_rounds;
}

void UcxTransport::progress_for(base::Deadline deadline, const std::function<bool()>& done) {
  while (!done() && base::Clock::now() < deadline) {
    if (!context_.engine->poll(0)) std::this_thread::yield();
  }
}

void UcxTransport::shutdown(base::Deadline deadline) {
  closing_ = true;
  auto sends_done = [this] {
    for (const auto& l : peers_)
      if (l.conn && !l.conn->failed() && l.conn->sends_in_flight() > 0) return false;
    return true;
  };
  // What we sent is delivered (a rendezvous completes once the peer has read our buffer).
  progress_for(deadline, sends_done);
  for (auto& l : peers_)
    if (l.conn && l.conn->open()) l.conn->say_goodbye(context_.rank);
  progress_for(deadline, sends_done);
  // The goodbyes reached the peers (remote completion), then the endpoints close.
  ucp_request_param_t param{};
  const ucs_status_ptr_t flush = ucp_worker_flush_nbx(worker_->get(), &param);
  if (flush != nullptr && !UCS_PTR_IS_ERR(flush)) {
    progress_for(deadline, [flush] { return ucp_request_check_status(flush) != UCS_INPROGRESS; });
    if (ucp_request_check_status(flush) == UCS_INPROGRESS)
      ucp_request_cancel(worker_->get(), flush);
    ucp_request_free(flush);
  }
  const Error closed = closing_error();
  for (auto& l : peers_) {
    if (!l.conn) continue;
    l.conn->close(closed);
    quiesce(*l.conn, false, deadline);  // nothing lands in a receive buffer after shutdown
  }
  progress_for(deadline, [this] {
    reap_close_requests();
    return close_requests_.empty();
  });
}

bool UcxTransport::whole_payloads(int peer) const {
  if (peer < 0 || static_cast<std::size_t>(peer) >= peers_.size()) return false;
  return peers_[static_cast<std::size_t>(peer)].whole_payloads;
}

const PeerMemory* UcxTransport::peer_memory(int peer) const {
  if (peer < 0 || static_cast<std::size_t>(peer) >= peers_.size()) return nullptr;
  const PeerLink& l = peers_[static_cast<std::size_t>(peer)];
  return l.conn && !l.conn->failed() ? l.memory.get() : nullptr;
}

RemoteAccess* UcxTransport::remote_access(int peer) {
  if (!native_rma_ || peer_memory(peer) != nullptr) return nullptr;
  const Connection* conn = link(peer);
  return conn != nullptr && conn->open() ? this : nullptr;
}

std::optional<std::string> UcxTransport::expose(std::uint64_t token, void* data, std::size_t bytes,
                                                std::string* why) {
  ucp_mem_h memh = nullptr;
  if (auto it = exposed_.find(token); it != exposed_.end()) {
    memh = it->second;
  } else {
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address = data;
    params.length = bytes;
    const ucs_status_t status = ucp_mem_map(worker_->context(), &params, &memh);
    if (status != UCS_OK) {
      if (why) *why = "ucp_mem_map of " + std::to_string(bytes) + " bytes: " + status_text(status);
      return std::nullopt;
    }
    exposed_.emplace(token, memh);
  }
  void* buffer = nullptr;
  std::size_t buffer_bytes = 0;
  const ucs_status_t status = ucp_rkey_pack(worker_->context(), memh, &buffer, &buffer_bytes);
  if (status != UCS_OK) {
    if (why) *why = "ucp_rkey_pack: " + status_text(status);
    return std::nullopt;
  }
  std::string packed(static_cast<const char*>(buffer), buffer_bytes);
  ucp_rkey_buffer_release(buffer);
  return packed;
}

void UcxTransport::conceal(std::uint64_t token) {
  auto it = exposed_.find(token);
  if (it == exposed_.end()) return;
  ucp_mem_unmap(worker_->context(), it->second);
  exposed_.erase(it);
}

bool UcxTransport::accept_key(int peer, std::uint64_t token, const std::string& packed,
                              std::string* why) {
  Connection* conn = link(peer);
  if (conn == nullptr) {
    if (why) *why = "no endpoint to rank " + std::to_string(peer);
    return false;
  }
  return conn->accept_key(token, packed, why);
}

void UcxTransport::forget_key(int peer, std::uint64_t token) {
  if (Connection* conn = link(peer)) conn->forget_key(token);
}

void UcxTransport::put(int peer, std::uint64_t token, const void* local, std::size_t bytes,
                       std::uint64_t remote, SendDone done) {
  // UCX reads the buffer; its API takes a non-const pointer for both directions.
  link(peer)->rma(true, token, const_cast<void*>(local), bytes, remote, std::move(done));
}

void UcxTransport::get(int peer, std::uint64_t token, void* local, std::size_t bytes,
                       std::uint64_t remote, SendDone done) {
  link(peer)->rma(false, token, local, bytes, remote, std::move(done));
}

void UcxTransport::flush(int peer, SendDone done) {
  link(peer)->flush(std::move(done));
}

std::string UcxTransport::describe_peer(int peer) const {
  const Connection* conn = link(peer);
  if (conn == nullptr) return "ucx (not connected)";
  std::string text = "ucx";
  const std::string lanes = conn->transports();
  text += lanes.empty() ? "" : " " + lanes;
  text += " (UCX_TLS=" + worker_->tls() + ")";
  if (peers_[static_cast<std::size_t>(peer)].memory) {
    text += "; its memory: cross-memory attach";
  } else {
    text += native_rma_ ? "; one-sided: UCX RMA" : "; one-sided: frames";
  }
  if (conn->failed()) text += " (closed)";
  return text;
}

}  // namespace anview::transport::ucx
