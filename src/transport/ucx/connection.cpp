#include "transport/ucx/connection.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <regex>

#include "base/log.hpp"
#include "transport/ucx/ucx_transport.hpp"
#include "transport/ucx/worker.hpp"

namespace anview::transport::ucx {

struct Connection::SendOp {
  Connection* conn = nullptr;
  std::size_t index = 0;  // in conn->sends_
  SendDone done;
  const char* operation = "send";                     // what UCX failed, for the error
  alignas(8) unsigned char header[sizeof(AmHeader)];  // UCX reads it until completion
};

struct Connection::RecvOp {
  Connection* conn = nullptr;
  std::size_t index = 0;  // in conn->receives_
  FrameHeader header;
  bool ordered = false;
  void* landing = nullptr;
};

Connection::Connection(UcxTransport& owner, int peer) : owner_(owner), peer_(peer) {}

Connection::~Connection() = default;

void Connection::drop_keys() {
  for (auto& [token, rkey] : rkeys_) ucp_rkey_destroy(rkey);
  rkeys_.clear();
}

Error Connection::link_error(const std::string& operation, const std::string& cause,
                             ErrorKind kind) const {
  ErrorContext ctx = owner_.error_context(peer_, operation);
  ctx.cause = cause;
  return Error(kind, std::move(ctx));
}

bool Connection::connect(const std::string& worker_address, const Hello& hello, bool watched,
                         std::string* why) {
  served_ = true;
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(worker_address.data());
  // UCX's shared-memory transports offer no peer failure handling: a peer whose process we
  // watch (same host) does without it, so UCX may pick them; others need it.
  params.err_mode = watched ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t status) {
    auto* self = static_cast<Connection*>(arg);
    self->owner_.on_endpoint_error(self->peer_, status);
  };
  params.err_handler.arg = this;
  const ucs_status_t status = ucp_ep_create(owner_.worker(), &params, &ep_);
  if (status != UCS_OK) {
    ep_ = nullptr;
    if (why) *why = "ucp_ep_create: " + status_text(status);
    return false;
  }
  SendOp* op = new_send(nullptr);
  std::memcpy(op->header, &hello, sizeof hello);
  const ucs_status_ptr_t request = post(am_hello, op, sizeof hello, nullptr, 0, 0);
  if (UCS_PTR_IS_ERR(request)) {
    if (why) *why = "sending the hello: " + status_text(UCS_PTR_STATUS(request));
    return false;
  }
  drain();  // frames that came before we knew the peer
  return true;
}

Connection::SendOp* Connection::new_send(SendDone done) {
  auto op = std::make_unique<SendOp>();
  op->conn = this;
  op->index = sends_.size();
  op->done = std::move(done);
  sends_.push_back(std::move(op));
  return sends_.back().get();
}

ucp_request_param_t Connection::completing(SendOp* op) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &Connection::send_done;
  param.user_data = op;
  return param;
}

void Connection::settle(SendOp* op, ucs_status_ptr_t request) {
  if (request == nullptr) {
    finish_send(op, UCS_OK);
  } else if (UCS_PTR_IS_ERR(request)) {
    finish_send(op, UCS_PTR_STATUS(request));
  }  // else send_done() finishes it
}

bool Connection::refused_closed(const char* operation, const SendDone& done) const {
  if (open()) return false;
  const Error error = error_ ? *error_
                             : link_error(operation, "the UCX endpoint to rank " +
                                                         std::to_string(peer_) + " is not open");
  if (done) done(&error);
  return true;
}

ucs_status_ptr_t Connection::post(unsigned id, SendOp* op, std::size_t header_bytes,
                                  const void* payload, std::size_t bytes, std::uint32_t flags) {
  ucp_request_param_t param = completing(op);
  if (flags != 0) {
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = flags;
  }
  const ucs_status_ptr_t request =
      ucp_am_send_nbx(ep_, id, op->header, header_bytes, payload, bytes, &param);
  settle(op, request);
  return request;
}

bool Connection::accept_key(std::uint64_t token, const std::string& packed, std::string* why) {
  if (!open()) {
    if (why) *why = "the endpoint is closed";
    return false;
  }
  ucp_rkey_h rkey = nullptr;
  const ucs_status_t status = ucp_ep_rkey_unpack(ep_, packed.data(), &rkey);
  if (status != UCS_OK) {
    if (why) *why = "ucp_ep_rkey_unpack: " + status_text(status);
    return false;
  }
  auto [it, added] = rkeys_.emplace(token, rkey);
  if (!added) {  // the same region's key again: keep the one operations may be using
    ucp_rkey_destroy(rkey);
  }
  return true;
}

void Connection::forget_key(std::uint64_t token) {
  auto it = rkeys_.find(token);
  if (it == rkeys_.end()) return;
  ucp_rkey_destroy(it->second);
  rkeys_.erase(it);
}

void Connection::rma(bool put, std::uint64_t token, void* local, std::size_t bytes,
                     std::uint64_t remote, SendDone done) {
  const char* operation = put ? "put" : "get";
  if (refused_closed(operation, done)) return;
  auto it = rkeys_.find(token);
  if (it == rkeys_.end()) {
    const Error error = link_error(operation,
                                   "no key of region " + std::to_string(token) + " of rank " +
                                       std::to_string(peer_) + " was accepted here",
                                   ErrorKind::internal);
    if (done) done(&error);
    return;
  }
  SendOp* op = new_send(std::move(done));
  op->operation = operation;
  const ucp_request_param_t param = completing(op);
  settle(op, put ? ucp_put_nbx(ep_, local, bytes, remote, it->second, &param)
                 : ucp_get_nbx(ep_, local, bytes, remote, it->second, &param));
}

void Connection::flush(SendDone done) {
  if (refused_closed("flush", done)) return;
  SendOp* op = new_send(std::move(done));
  op->operation = "flush";
  const ucp_request_param_t param = completing(op);
  settle(op, ucp_ep_flush_nbx(ep_, &param));
}

void Connection::send_done(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<SendOp*>(user_data);
  ucp_request_free(request);
  op->conn->finish_send(op, status);
}

void Connection::finish_send(SendOp* op, ucs_status_t status) {
  // Out of sends_ first: `done` may post more sends (and grow the vector).
  std::unique_ptr<SendOp> owned = std::move(sends_[op->index]);
  if (op->index + 1 != sends_.size()) {
    sends_[op->index] = std::move(sends_.back());
    sends_[op->index]->index = op->index;
  }
  sends_.pop_back();
  if (!owned->done) return;
  if (status == UCS_OK) {
    owned->done(nullptr);
    return;
  }
  const Error error =
      error_ ? *error_
             : link_error(owned->operation, "UCX failed the " + std::string(owned->operation) +
                                                " with rank " + std::to_string(peer_) + ": " +
                                                status_text(status));
  owned->done(&error);
}

void Connection::send(const FrameHeader& header, const void* payload, Ordering ordering,
                      SendDone done) {
  if (refused_closed("send", done)) return;
  AmHeader h;
  h.frame = header;
  h.source = static_cast<std::uint32_t>(owner_.rank());
  if (ordering == Ordering::ordered) {
    h.flags = ordered_flag;
    h.seq = next_send_seq_++;
  }
  SendOp* op = new_send(std::move(done));
  std::memcpy(op->header, &h, sizeof h);
  post(am_frame, op, sizeof h, payload, header.payload_bytes, 0);
}

bool Connection::try_send_now(const FrameHeader& header, const void* payload) {
  if (!open()) return false;
  AmHeader h;
  h.frame = header;
  h.source = static_cast<std::uint32_t>(owner_.rank());
  h.flags = ordered_flag;
  h.seq = next_send_seq_;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL;
  param.flags = UCP_AM_SEND_FLAG_EAGER;
  const ucs_status_ptr_t request =
      ucp_am_send_nbx(ep_, am_frame, &h, sizeof h, payload, header.payload_bytes, &param);
  if (request == nullptr) {
    ++next_send_seq_;
    return true;
  }
  if (UCS_PTR_IS_ERR(request)) return false;  // UCS_ERR_NO_RESOURCE: nothing was sent
  // UCX took it after all (it should not, with FORCE_IMM_CMPL): it is sent, and UCX's copy
  // of the header and of the payload (eager: copied at once) completes on its own.
  ucp_request_free(request);
  ++next_send_seq_;
  return true;
}

void Connection::say_goodbye(int own_rank) {
  if (open()) send_bye(hello_magic, own_rank);
}

void Connection::say_closed(int own_rank) {
  if (ep_ != nullptr && hello_received_) send_bye(close_magic, own_rank);
}

void Connection::send_bye(std::uint32_t magic, int own_rank) {
  Bye bye;
  bye.magic = magic;
  bye.rank = static_cast<std::uint32_t>(own_rank);
  SendOp* op = new_send(nullptr);
  std::memcpy(op->header, &bye, sizeof bye);
  post(am_bye, op, sizeof bye, nullptr, 0, 0);
}

bool Connection::deliverable(const AmHeader& header) const {
  if (!served_ || failed_ || deferred_) return false;
  if ((header.flags & ordered_flag) == 0) return true;
  return header.seq == next_receive_seq_ && !ordered_busy_;
}

ucs_status_t Connection::on_frame(const AmHeader& header, void* data, std::size_t length,
                                  const ucp_am_recv_param_t& param) {
  const bool rendezvous = (param.recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if (failed_) return UCS_OK;  // dropped (a rendezvous sender completes; it is failing too)
  Incoming in{.header = header,
              .kind = rendezvous ? Incoming::Data::rendezvous : Incoming::Data::transient,
              .data = data,
              .length = length};
  Incoming* mine = &in;
  transient_ = mine;
  if (waiting_.empty() && !draining_ && deliverable(header)) {
    // The common case, nothing queued before it: straight to the sink.
    const Outcome outcome = deliver(in);
    if (outcome != Outcome::deferred) transient_ = nullptr;
  } else {
    waiting_.push_back(std::move(in));
    mine = &waiting_.back();
    transient_ = mine;
    drain();
  }
  const bool handed_over = transient_handed_over_;  // to ucp_am_recv_data_nbx
  transient_handed_over_ = false;
  if (transient_ == nullptr) {  // delivered, or dropped by a failure
    return handed_over ? UCS_INPROGRESS : UCS_OK;
  }
  transient_ = nullptr;
  if (mine == &in) {  // deferred on the fast path: it waits at the head of the queue
    waiting_.push_back(std::move(in));
    mine = &waiting_.back();
  }
  // Waits: keep UCX's buffer where UCX lets us, else copy it.
  if (rendezvous) return UCS_INPROGRESS;
  if ((param.recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) != 0) {
    mine->kind = Incoming::Data::held;
    return UCS_INPROGRESS;
  }
  mine->kind = Incoming::Data::copied;
  mine->copy.assign(static_cast<const char*>(data), static_cast<const char*>(data) + length);
  mine->data = nullptr;
  return UCS_OK;
}

void Connection::resume() {
  deferred_ = false;
  drain();
}

void Connection::drain() {
  if (draining_) {  // a sink callback resumed us: the running loop goes on
    drain_again_ = true;
    return;
  }
  draining_ = true;
  do {
    drain_again_ = false;
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (!served_ || failed_ || deferred_) break;
      if (!deliverable(it->header)) {
        ++it;
        continue;
      }
      const Outcome outcome = deliver(*it);
      if (failed_) break;  // close() released everything; the list is cleared below
      if (outcome == Outcome::deferred) break;
      if (&*it == transient_) transient_ = nullptr;
      waiting_.erase(it);
      it = waiting_.begin();  // an ordered frame further up may be next now
    }
  } while (drain_again_ && !failed_);
  draining_ = false;
  if (failed_) waiting_.clear();
}

Connection::Outcome Connection::deliver(Incoming& in) {
  const bool ordered = (in.header.flags & ordered_flag) != 0;
  const FrameHeader& h = in.header.frame;
  const Landing landing = owner_.sink().on_frame(peer_, h, !owner_.closing() && !must_accept_);
  if (failed_) {
    release(in);
    return Outcome::failed;
  }
  if (landing.defer) {
    deferred_ = true;
    return Outcome::deferred;
  }
  if (ordered) ++next_receive_seq_;
  if (h.payload_bytes == 0 || landing.data == nullptr) {
    release(in);
    owner_.sink().on_frame_done(peer_, h, landing.data);
    return Outcome::delivered;
  }
  if (in.kind == Incoming::Data::rendezvous) {
    auto op = std::make_unique<RecvOp>();
    op->conn = this;
    op->index = receives_.size();
    op->header = h;
    op->ordered = ordered;
    op->landing = landing.data;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.recv_am = &Connection::receive_done;
    param.user_data = op.get();
    const ucs_status_ptr_t request =
        ucp_am_recv_data_nbx(owner_.worker(), in.data, landing.data, in.length, &param);
    in.data = nullptr;  // UCX owns the descriptor now, even if it failed
    if (&in == transient_) transient_handed_over_ = true;
    if (request == nullptr) {
      owner_.sink().on_frame_done(peer_, h, landing.data);
      return Outcome::delivered;
    }
    if (UCS_PTR_IS_ERR(request)) {
      owner_.fail_link(peer_, link_error("receive", "UCX cannot receive a rendezvous of " +
                                                        std::to_string(in.length) + " bytes: " +
                                                        status_text(UCS_PTR_STATUS(request))));
      return Outcome::failed;
    }
    if (ordered) ordered_busy_ = true;
    receives_.push_back(std::move(op));
    return Outcome::delivered;
  }
  const char* source =
      in.kind == Incoming::Data::copied ? in.copy.data() : static_cast<const char*>(in.data);
  std::memcpy(landing.data, source, h.payload_bytes);
  release(in);
  owner_.sink().on_frame_done(peer_, h, landing.data);
  return Outcome::delivered;
}

void Connection::receive_done(void* request, ucs_status_t status, std::size_t, void* user_data) {
  auto* op = static_cast<RecvOp*>(user_data);
  ucp_request_free(request);
  Connection* conn = op->conn;
  // The connection outlives the worker (the transport destroys the worker first), so a
  // receive that completes after close() still finds it.
  std::unique_ptr<RecvOp> owned = std::move(conn->receives_[op->index]);
  if (op->index + 1 != conn->receives_.size()) {
    conn->receives_[op->index] = std::move(conn->receives_.back());
    conn->receives_[op->index]->index = op->index;
  }
  conn->receives_.pop_back();
  if (conn->failed_) return;
  if (status != UCS_OK) {
    conn->owner_.fail_link(
        conn->peer_, conn->link_error("receive", "UCX failed a rendezvous receive of " +
                                                     std::to_string(op->header.payload_bytes) +
                                                     " bytes: " + status_text(status)));
    return;
  }
  if (op->ordered) conn->ordered_busy_ = false;
  conn->owner_.sink().on_frame_done(conn->peer_, op->header, op->landing);
  conn->drain();
}

void Connection::release(Incoming& in) {
  // The current callback's data: UCX drops it when the callback returns UCS_OK.
  if (&in == transient_) {
    in.data = nullptr;
    return;
  }
  if (in.data != nullptr &&
      (in.kind == Incoming::Data::held || in.kind == Incoming::Data::rendezvous)) {
    ucp_am_data_release(owner_.worker(), in.data);
  }
  in.data = nullptr;
  in.copy.clear();
}

void Connection::close(const Error& error) {
  if (failed_) return;
  failed_ = true;
  error_ = error;
  for (auto& in : waiting_) release(in);
  // A drain() in progress holds an iterator into the list: it clears the list itself.
  if (!draining_) waiting_.clear();
  transient_ = nullptr;
  // Receives still landing complete into receive_done(), which drops them: the sink hears of
  // the failure instead.
  exit_watch.reset();
}

bool Connection::close_endpoint(std::vector<void*>& requests) {
  if (!failed_ || ep_ == nullptr) return false;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  const ucs_status_ptr_t request = ucp_ep_close_nbx(ep_, &param);  // fails sends in flight
  if (request != nullptr && !UCS_PTR_IS_ERR(request)) requests.push_back(request);
  ep_ = nullptr;
  return true;
}

std::string Connection::transports() const {
  if (ep_ == nullptr) return {};
  char* text = nullptr;
  std::size_t bytes = 0;
  FILE* stream = ::open_memstream(&text, &bytes);
  if (stream == nullptr) return {};
  ucp_ep_print_info(ep_, stream);
  std::fclose(stream);
  const std::string info(text, bytes);
  std::free(text);
  // Lines such as "#   lane[0]:  8:tcp/lo.0 md[4] ...": keep each "tcp/lo" once.
  std::vector<std::string> found;
  static const std::regex lane(R"(lane\[\d+\]:\s+\d+:([A-Za-z0-9_]+/[A-Za-z0-9_:\-]+))");
  for (auto it = std::sregex_iterator(info.begin(), info.end(), lane); it != std::sregex_iterator();
       ++it) {
    const std::string name = (*it)[1].str();
    if (std::find(found.begin(), found.end(), name) == found.end()) found.push_back(name);
  }
  std::string out;
  for (const auto& name : found) out += (out.empty() ? "" : ", ") + name;
  return out;
}

void Connection::abandon() {
  for (auto& op : sends_) op->done = nullptr;
}

}  // namespace anview::transport::ucx
