#include "p2p/messenger.hpp"

#include <unistd.h>

#include <thread>

#include "base/config.hpp"
#include "base/limits.hpp"
#include "base/log.hpp"
#include "base/random.hpp"
#include "base/timeouts.hpp"
#include "p2p/protocol.hpp"
#include "p2p/request_pool.hpp"
#include "transport/registry.hpp"
#include "transport/self/self_transport.hpp"

namespace anview::p2p {
namespace {

const base::Setting eager_setting(
    "p2p", "ANVIEW_EAGER_BYTES", "64K",
    "Messages up to this size are sent eagerly; larger ones use a rendezvous (zero-copy receive)");
const base::Setting unexpected_setting(
    "p2p", "ANVIEW_UNEXPECTED_BYTES", "32M",
    "Per-peer budget for messages that arrive before their receive; beyond it the sender waits");
const base::Setting chunk_setting(
    "p2p", "ANVIEW_RNDV_CHUNK", "1M",
    "Rendezvous payloads are cut into chunks of this size, spread over the transport's streams "
    "(ucx over shared memory or RDMA, which pipelines large transfers itself, takes whole "
    "payloads unless this is set)");
const base::Setting spin_setting(
    "p2p", "ANVIEW_SPIN_US", "100",
    "How long a waiting thread polls before it sleeps in the kernel (microseconds)");

constexpr auto shutdown_linger = std::chrono::seconds(2);
// Rounds a waiter drives before it first reads the clock.
constexpr int fast_rounds = 64;
// progress() and test() look at the fds at least this often (drive()).
constexpr auto polled_fd_check_interval = std::chrono::microseconds(50);
// How often a purely spinning waiter still yields its core (a system call: not too often).
constexpr auto yield_interval = std::chrono::microseconds(20);

transport::FrameHeader eager_header(std::size_t bytes, Tag tag) {
  transport::FrameHeader h;
  h.type = static_cast<std::uint8_t>(FrameType::eager);
  h.payload_bytes = static_cast<std::uint32_t>(bytes);
  h.tag = to_underlying(tag);
  return h;
}

}  // namespace

Messenger::Messenger(const MessengerConfig& config)
    : config_(config),
      peers_(static_cast<std::size_t>(config.world_size)),
      posted_(config.world_size),
      unexpected_(config.world_size),
      regions_(base::random_u64() ^ reinterpret_cast<std::uintptr_t>(this), config.job_id),
      eager_bytes_(static_cast<std::size_t>(eager_setting.as_int())),
      unexpected_limit_(static_cast<std::size_t>(unexpected_setting.as_int())),
      spin_(std::chrono::microseconds(spin_setting.as_int())) {
  if (base::Trace* t = base::Trace::active(); t != nullptr && t->transfers()) trace_ = t;
  watchdog_ = base::watchdog_setting().as_duration();
  eager_bytes_ = std::min<std::size_t>(eager_bytes_, base::limits::max_frame_bytes());
  // ANVIEW_RNDV_CHUNK for every peer; connect() may give a peer whole payloads instead.
  const auto chunk = static_cast<std::size_t>(
      std::clamp<std::int64_t>(chunk_setting.as_int(), 4096, base::limits::max_frame_bytes()));
  for (auto& ps : peers_) ps.chunk_bytes = chunk;
  const transport::TransportContext context{.rank = config.rank,
                                            .world_size = config.world_size,
                                            .job_id = config.job_id,
                                            .host_id = config.host_id,
                                            .timeout = config.timeout,
                                            .engine = &engine_,
                                            .sink = this};
  self_ = std::make_unique<transport::self::SelfTransport>(context);
  transports_ = transport::create_transports(context);
  metrics_ = base::metrics::Group([this](base::metrics::Sink& sink) { collect_metrics(sink); });
}

Messenger::~Messenger() {
  if (!closed_) shutdown();
}

transport::PeerInfo Messenger::self_info() const {
  transport::PeerInfo info;
  info.rank = config_.rank;
  info.host_id = config_.host_id;
  info.pid = static_cast<int>(::getpid());
  for (const auto& t : transports_) t->describe_self(info);
  return info;
}

void Messenger::connect(const std::vector<transport::PeerInfo>& peers) {
  const base::Deadline deadline = base::deadline_after(config_.timeout);
  {
    Lock lock(mu_);
    std::vector<std::vector<transport::PeerInfo>> groups(transports_.size());
    for (const auto& peer : peers) {
      auto selection = transport::select_transport(transports_, *self_, peer);
      if (selection.transport == nullptr) {
        throw Error(ErrorKind::link, {.rank = config_.rank,
                                      .peer = peer.rank,
                                      .operation = "connect",
                                      .cause = selection.reason});
      }
      PeerState& ps = peers_[static_cast<std::size_t>(peer.rank)];
      ps.transport = selection.transport;
      ps.transport_reason = selection.reason;
      if (peer.rank != config_.rank) {
        base::log("p2p", base::LogLevel::info, "rank ", peer.rank, " via ",
                  selection.transport->name(), ": ", selection.reason);
      }
      for (std::size_t i = 0; i < transports_.size(); ++i)
        if (transports_[i].get() == selection.transport) groups[i].push_back(peer);
    }
    for (std::size_t i = 0; i < transports_.size(); ++i)
      if (!groups[i].empty()) transports_[i]->connect(groups[i]);
    // A transport that pipelines large transfers to a peer itself (ucx over shared memory or
    // RDMA) gets whole payloads, unless the user set the chunk.
    if (!chunk_setting.from_environment()) {
      for (const auto& peer : peers) {
        PeerState& ps = peers_[static_cast<std::size_t>(peer.rank)];
        if (ps.transport->whole_payloads(peer.rank))
          ps.chunk_bytes = base::limits::max_frame_bytes();
      }
    }
    // Tens of microseconds of spinning between epoll system calls: what the fds carry here
    // (a peer process's exit, a wake-up meant for a sleeping driver) can wait that long, and
    // a system call costs a good part of a microsecond on a virtual machine. Every 256 rounds
    // put one in most 8-byte round trips (shm ping-pong 9 % slower).
    fd_check_every_ = 4096;
    for (std::size_t i = 0; i < transports_.size(); ++i)
      if (!groups[i].empty() && transports_[i]->capabilities().fd_driven) fd_check_every_ = 1;
  }
  for (;;) {
    {
      Lock lock(mu_);
      bool ready = true;
      std::string pending;
      for (const auto& t : transports_) {
        if (auto failure = t->setup_failure())
          throw failure->for_operation("connect", std::nullopt);
        if (t->ready()) continue;
        ready = false;
        pending += t->pending_connections();
      }
      if (ready) return;
      if (base::Clock::now() >= deadline) {
        throw Error(ErrorKind::timeout, {.rank = config_.rank,
                                         .operation = "connect",
                                         .cause = "connections not up after " +
                                                  std::to_string(config_.timeout.count()) +
                                                  " ms; still waiting for " + pending});
      }
    }
    // Bootstrap runs on one thread: it owns the driver role while it waits.
    while (!take_driver_role()) std::this_thread::yield();
    drive(10);
    release_driver_role();
  }
}

Error Messenger::request_error(const RequestImpl& r, ErrorKind kind, std::string cause) const {
  return Error(
      kind,
      {.rank = config_.rank,
       .peer = r.kind == RequestImpl::Kind::recv && r.status.source >= 0 ? r.status.source : r.peer,
       .operation = r.kind == RequestImpl::Kind::external ? r.operation
                    : r.kind == RequestImpl::Kind::send   ? "send"
                    : r.kind == RequestImpl::Kind::recv   ? "recv"
                    : r.kind == RequestImpl::Kind::put    ? "put"
                    : r.kind == RequestImpl::Kind::get    ? "get"
                                                          : "flush",
       // A matched wildcard receive names the tag it matched.
       .tag = to_underlying(r.tag == any_tag && r.status.source >= 0 ? r.status.tag : r.tag),
       .cause = std::move(cause)});
}

bool Messenger::send_now(const void* data, std::size_t bytes, int peer, Tag tag) {
  if (bytes > eager_bytes_ || peer < 0 || peer >= config_.world_size ||
      to_underlying(tag) >= reserved_tags || (data == nullptr && bytes > 0)) {
    return false;
  }
  Lock lock(mu_);
  PeerState& ps = peers_[static_cast<std::size_t>(peer)];
  const bool sent = !closed_ && !ps.failure && ps.transport != nullptr &&
                    ps.transport->try_send_now(peer, eager_header(bytes, tag), data);
  if constexpr (base::metrics::enabled) {
    if (sent) {
      auto& st = peers_[static_cast<std::size_t>(peer)].stats;
      ++st.sent_messages;
      st.sent_bytes += bytes;
    }
  }
  if (sent && trace_ != nullptr) {
    const auto now = base::Clock::now();
    trace_->add(base::Trace::Track::p2p, "send", now, now,
                "\"peer\":" + std::to_string(peer) + ",\"tag\":" +
                    std::to_string(to_underlying(tag)) + ",\"bytes\":" + std::to_string(bytes));
  }
  return sent;
}

RequestPtr Messenger::isend(const void* data, std::size_t bytes, int peer, Tag tag, Poster poster) {
  const bool internal = poster == Poster::internal;
  auto req = new_request(poster == Poster::blocking ? nullptr : shared_from_this(),
                         RequestImpl::Kind::send, peer, tag);
  if (peer < 0 || peer >= config_.world_size)
    throw request_error(*req, ErrorKind::usage,
                        "peer " + std::to_string(peer) +
                            " is not a rank of this communicator (size " +
                            std::to_string(config_.world_size) + ")");
  if (to_underlying(tag) >= reserved_tags && (!internal || tag == any_tag))
    throw request_error(*req, ErrorKind::usage, "tags at or above 2^63 are reserved");
  if (data == nullptr && bytes > 0)
    throw request_error(*req, ErrorKind::usage, "null buffer for a non-empty message");
  req->send_data = static_cast<const char*>(data);
  req->send_bytes = bytes;
  req->status = Status{config_.rank, tag, bytes};
  if (trace_ != nullptr || (base::metrics::enabled && bytes > eager_bytes_))
    req->posted = base::Clock::now();
  {
    Lock lock(mu_);
    PeerState& ps = peers_[static_cast<std::size_t>(peer)];
    if (closed_) {
      complete(req, request_error(*req, ErrorKind::usage, "the communicator is closed"));
    } else if (ps.failure) {
      complete(req, ps.failure->for_operation("send", to_underlying(tag)));
    } else if (bytes <= eager_bytes_ && ps.transport != nullptr &&
               ps.transport->try_send_now(peer, eager_header(bytes, tag), data)) {
      req->phase = RequestImpl::Phase::complete;  // handed over: complete before anyone saw it
      if constexpr (base::metrics::enabled) count(*req);
      if (trace_ != nullptr) trace_transfer(*req);
      req->done.store(true, std::memory_order_release);
    } else if (bytes <= eager_bytes_) {
      const transport::FrameHeader h = eager_header(bytes, tag);
      // The request stays alive until the transport is done with it (keep_alive, released
      // by complete()); the callback holds a plain pointer and fits std::function's inline
      // storage: no allocation per message.
      req->keep_alive = req;
      RequestImpl* r = req.get();
      send_frame(peer, h, data, transport::Ordering::ordered, [this, r](const Error* e) {
        complete(*r,
                 e ? std::optional<Error>(e->for_operation("send", to_underlying(r->tag)))
                   : std::nullopt,
                 nullptr);  // keep_alive holds it
      });
    } else {
      req->id = next_id_++;
      sends_.emplace(req->id, req);
      transport::FrameHeader h;
      h.type = static_cast<std::uint8_t>(FrameType::rts);
      h.tag = to_underlying(tag);
      h.id = req->id;
      h.arg = bytes;
      send_frame(peer, h, nullptr, transport::Ordering::ordered, nullptr);
    }
    if (!completed_.empty()) run_completed(lock);
  }
  return req;
}

RequestPtr Messenger::irecv(void* data, std::size_t capacity, int source, Tag tag, Poster poster) {
  const bool internal = poster == Poster::internal;
  auto req = new_request(poster == Poster::blocking ? nullptr : shared_from_this(),
                         RequestImpl::Kind::recv, source, tag);
  if (source != any_source && (source < 0 || source >= config_.world_size))
    throw request_error(*req, ErrorKind::usage,
                        "source " + std::to_string(source) +
                            " is not a rank of this communicator (size " +
                            std::to_string(config_.world_size) + ")");
  if (tag != any_tag && to_underlying(tag) >= reserved_tags && !internal)
    throw request_error(*req, ErrorKind::usage, "tags at or above 2^63 are reserved");
  if (data == nullptr && capacity > 0)
    throw request_error(*req, ErrorKind::usage, "null buffer with a non-zero capacity");
  req->recv_data = static_cast<char*>(data);
  req->capacity = capacity;
  if (trace_ != nullptr || (base::metrics::enabled && capacity > eager_bytes_))
    req->posted = base::Clock::now();
  {
    Lock lock(mu_);
    const auto found = closed_ ? std::nullopt : unexpected_.find(source, tag);
    if (closed_) {
      complete(req, request_error(*req, ErrorKind::usage, "the communicator is closed"));
    } else if (found) {
      match_unexpected(req, *found);
    } else if (source != any_source && peers_[static_cast<std::size_t>(source)].failure) {
      complete(req, peers_[static_cast<std::size_t>(source)].failure->for_operation(
                        "recv", to_underlying(tag)));
    } else if (source == any_source && all_remote_peers_failed()) {
      complete(req, request_error(*req, ErrorKind::peer_lost,
                                  "every other rank of the communicator is lost"));
    } else {
      posted_.push(req);
      // Reading from a peer paused on a message over the unexpected budget (on_frame): that
      // message may be this receive's, which takes it over the budget. Resume; a frame that
      // still matches nothing pauses reading again.
      if (source != any_source) {
        resume_reading(source);
      } else {
        for (int p = 0; p < config_.world_size; ++p) resume_reading(p);
      }
    }
    if (!completed_.empty()) run_completed(lock);
  }
  return req;
}

bool Messenger::all_remote_peers_failed() const {
  if (config_.world_size <= 1) return false;
  for (int r = 0; r < config_.world_size; ++r)
    if (r != config_.rank && !peers_[static_cast<std::size_t>(r)].failure) return false;
  return true;
}

void Messenger::send_frame(int peer, const transport::FrameHeader& header, const void* payload,
                           transport::Ordering ordering, transport::SendDone done) {
  transport::Transport* t = peers_[static_cast<std::size_t>(peer)].transport;
  if (t == nullptr) {
    const Error error(ErrorKind::internal, {.rank = config_.rank,
                                            .peer = peer,
                                            .operation = "send",
                                            .cause = "no transport serves this peer"});
    if (done) done(&error);
    return;
  }
  t->post_send(
      peer, header, payload, ordering, done ? std::move(done) : [](const Error*) {});
}

void Messenger::complete(RequestPtr request, std::optional<Error> error) {
  RequestImpl& r = *request;
  complete(r, std::move(error), std::move(request));
}

void Messenger::complete(RequestImpl& request, std::optional<Error> error, RequestPtr ref) {
  // A reference goes to completed_ and is dropped only after the lock is released (it may be
  // the last one, e.g. keep_alive): keep_alive if set, else the caller's. Every caller passes
  // one or set keep_alive: a request has no shared_from_this (its weak self-reference cost
  // three atomic operations per request, and kept its last release off the fast path).
  if (request.keep_alive) ref = std::move(request.keep_alive);
  if (request.phase == RequestImpl::Phase::complete) {
    if (ref) completed_.push_back(std::move(ref));
    return;
  }
  request.phase = RequestImpl::Phase::complete;
  request.error = std::move(error);
  if (request.kind == RequestImpl::Kind::send || request.kind == RequestImpl::Kind::recv) {
    if constexpr (base::metrics::enabled) count(request);
    if (trace_ != nullptr) trace_transfer(request);
  }
  request.done.store(true, std::memory_order_release);
  // A blocking call's request (no owner, so no callback and no Messenger reference) needs no
  // work after the lock: its reference is dropped right here, even where it is the last one
  // (the waiter gave up), unless a thread sleeps on cv_ and must be woken (sleepers_ grows
  // under mu_ only: a later sleeper sees done first). This keeps a message that completes
  // a blocking recv off completed_, Completions and run_callbacks.
  if (request.owner == nullptr && !request.callback &&
      sleepers_.load(std::memory_order_seq_cst) == 0)
    return;
  completed_.push_back(std::move(ref));
}

void Messenger::count(const RequestImpl& request) {
  const bool recv = request.kind == RequestImpl::Kind::recv;
  const int peer = recv && request.status.source >= 0 ? request.status.source : request.peer;
  if (peer < 0 || peer >= size()) return;  // a wildcard receive that never matched
  auto& st = peers_[static_cast<std::size_t>(peer)].stats;
  if (request.error) {
    ++st.errors;
    return;
  }
  const std::size_t bytes = request.status.bytes;
  (recv ? st.received_messages : st.sent_messages) += 1;
  (recv ? st.received_bytes : st.sent_bytes) += bytes;
  if (request.posted != base::Clock::time_point{} && bytes > eager_bytes_)
    (recv ? st.recv_latency : st.send_latency).observe(base::Clock::now() - request.posted);
}

void Messenger::collect_metrics(base::metrics::Sink& sink) const {
  Lock lock(mu_);
  const base::metrics::Labels base{{"rank", std::to_string(rank())}, {"comm", config_.name}};
  for (int p = 0; p < size(); ++p) {
    if (p == rank()) continue;
    const PeerState& ps = peers_[static_cast<std::size_t>(p)];
    base::metrics::Labels l = base;
    l.emplace_back("peer", std::to_string(p));
    l.emplace_back("transport",
                   ps.transport != nullptr ? std::string(ps.transport->name()) : "none");
    auto with = [&](const char* direction) {
      auto d = l;
      d.emplace_back("direction", direction);
      return d;
    };
    const auto& st = ps.stats;
    const char* messages_help = "Point-to-point messages completed with a peer";
    const char* bytes_help = "Point-to-point payload bytes completed with a peer";
    sink.counter("anview_p2p_messages_total", messages_help, with("sent"),
                 static_cast<double>(st.sent_messages));
    sink.counter("anview_p2p_messages_total", messages_help, with("received"),
                 static_cast<double>(st.received_messages));
    sink.counter("anview_p2p_bytes_total", bytes_help, with("sent"),
                 static_cast<double>(st.sent_bytes));
    sink.counter("anview_p2p_bytes_total", bytes_help, with("received"),
                 static_cast<double>(st.received_bytes));
    sink.counter("anview_rma_native_operations_total",
                 "One-sided puts and gets to a peer through the transport's native path (UCX RMA)",
                 l, static_cast<double>(st.native_rma));
    sink.counter("anview_p2p_errors_total", "Point-to-point requests with a peer that failed", l,
                 static_cast<double>(st.errors));
    const char* latency_help =
        "Time from posting to completing a rendezvous-sized (above ANVIEW_EAGER_BYTES) request";
    sink.histogram("anview_p2p_latency_seconds", latency_help, with("sent"), st.send_latency);
    sink.histogram("anview_p2p_latency_seconds", latency_help, with("received"), st.recv_latency);
    sink.gauge("anview_p2p_unexpected_bytes",
               "Bytes from a peer held before their receive was posted, 64 more per message "
               "for its queue entry (flow control: reading pauses at ANVIEW_UNEXPECTED_BYTES)",
               l, static_cast<double>(ps.unexpected_bytes));
    sink.gauge("anview_p2p_reading_paused",
               "1 while frames from a peer wait because its unexpected-message budget is full", l,
               ps.deferred ? 1 : 0);
    sink.gauge("anview_p2p_peer_failed", "1 once the link to a peer has failed", l,
               ps.failure && !ps.left ? 1 : 0);
  }
  for (const auto& t : transports_) t->collect_metrics(sink, base);
}

void Messenger::trace_transfer(const RequestImpl& request) const {
  const bool recv = request.kind == RequestImpl::Kind::recv;
  const auto tag = to_underlying(recv ? request.status.tag : request.tag);
  std::string args = "\"peer\":" + std::to_string(recv ? request.status.source : request.peer);
  args += tag >= reserved_tags ? ",\"collective_tag\":" + std::to_string(tag - reserved_tags)
                               : ",\"tag\":" + std::to_string(tag);
  args += ",\"bytes\":" + std::to_string(request.status.bytes);
  if (request.error) args += ",\"error\":" + base::Trace::quoted(request.error->what());
  trace_->add(base::Trace::Track::p2p, recv ? "recv" : "send", request.posted, base::Clock::now(),
              args);
}

void Messenger::take_completed(Completions& out) {
  if (completed_.empty()) return;
  for (auto& r : completed_) {
    if (r->callback) {
      Request::Callback callback = std::exchange(r->callback, nullptr);
      out.add(std::move(r), std::move(callback));
    } else {
      out.add(std::move(r));
    }
  }
  completed_.clear();  // keeps its capacity: no allocation on the next completion
  out.notify = sleepers_.load(std::memory_order_seq_cst) > 0;
}

void Messenger::run_completed(Lock& lock) {
  Completions completed;
  take_completed(completed);
  lock.unlock();
  run_callbacks(completed);
}

void Messenger::run_callbacks(Completions& completed) {
  if (completed.notify) cv_.notify_all();
  completed.run();
}

void Completions::add(RequestPtr request, Request::Callback callback) {
  callbacks_.emplace_back(std::move(request), std::move(callback));
}

void Completions::add(RequestPtr request) {
  if (count_ < inline_count) {
    held_[count_++] = std::move(request);
  } else {
    more_.push_back(std::move(request));
  }
}

namespace {

// "recv from rank 1, tag 7": whose callback it was, for the log.
std::string callback_owner(const RequestImpl& r) {
  static constexpr const char* kinds[] = {"send", "recv", "collective", "put", "get", "flush"};
  std::string text = kinds[static_cast<int>(r.kind)];
  if (!r.operation.empty()) text += " " + r.operation;
  if (r.peer >= 0)
    text += std::string(r.kind == RequestImpl::Kind::recv ? " from" : " to") + " rank " +
            std::to_string(r.peer);
  if (r.kind == RequestImpl::Kind::send || r.kind == RequestImpl::Kind::recv)
    text += ", tag " + std::to_string(to_underlying(r.tag));
  return text;
}

// Logs the exception in flight (call it in a catch block) of `r`'s completion callback, which
// is dropped.
void log_dropped_exception(const RequestImpl& r) {
  try {
    throw;
  } catch (const std::exception& e) {
    base::log("p2p", base::LogLevel::error, "a completion callback (", callback_owner(r),
              ") threw; the exception is dropped: ", e.what());
  } catch (...) {
    base::log("p2p", base::LogLevel::error, "a completion callback (", callback_owner(r),
              ") threw a non-standard exception; it is dropped");
  }
}

}  // namespace

void Completions::run() {
  // A callback that throws ends neither the round (the driver role would stay taken: every
  // later wait of the rank would time out) nor the other callbacks; on the background thread it
  // would end the process. Its exception is logged and dropped.
  for (auto& [r, callback] : callbacks_) {
    try {
      callback(r->status, r->error ? &*r->error : nullptr);
    } catch (...) {
      log_dropped_exception(*r);
    }
  }
}

void Messenger::on_complete(RequestImpl& request, Request::Callback callback) {
  if (on_complete_if_pending(request, std::move(callback))) return;
  callback(request.status, request.error ? &*request.error : nullptr);  // still ours: not moved
}

bool Messenger::on_complete_if_pending(RequestImpl& request, Request::Callback&& callback) {
  Lock lock(mu_);
  if (request.phase == RequestImpl::Phase::complete) return false;
  if (!request.callback) {
    request.callback = std::move(callback);
  } else {  // every callback registered runs, in the order they came (on_complete, co_await)
    // The first one's exception is dropped here, so that the second runs; Completions::run()
    // drops the second one's.
    request.callback = [&request, first = std::move(request.callback), then = std::move(callback)](
                           const Status& status, const Error* error) {
      try {
        first(status, error);
      } catch (...) {
        log_dropped_exception(request);
      }
      then(status, error);
    };
  }
  return true;
}

void Messenger::drive(int sleep_ms, bool polled) {
  // One lock round per call: sleep in epoll without the lock, then dispatch what came and run
  // the pollers together. Pollers with work left keep the next call from sleeping.
  // A round that may not sleep skips the epoll_wait system call unless file descriptors carry
  // peer traffic (shm rings need none): then epoll is polled once per fd_check_every_ rounds,
  // and by a program's own polling (progress(), test()), which may call rarely, whenever
  // polled_fd_check_interval has passed.
  const int timeout = pollers_busy_ ? 0 : sleep_ms;
  const bool check_fds =
      timeout != 0 || --rounds_to_fd_check_ == 0 ||
      (polled && base::Clock::now() - last_fd_check_ >= polled_fd_check_interval);
  if (check_fds) {
    rounds_to_fd_check_ = fd_check_every_;
    if (fd_check_every_ > 1) last_fd_check_ = base::Clock::now();
  }
  // The common spinning round: no fd check due and the pollers say (lock-free) that they have
  // nothing to do, so the lock round is skipped: a waiter spins on a few atomics only.
  if (!check_fds && !engine_.pollers_may_have_work()) return;
  const int n = check_fds ? engine_.wait_events(timeout) : 0;
  Lock lock(mu_);
  engine_.dispatch_events(n);
  // A round a hint started runs the hinted pollers only; a round that checked the fds
  // (every fd_check_every_ rounds, or before sleeping) runs them all.
  pollers_busy_ = engine_.run_pollers(/*hinted_only=*/!check_fds);
  if (!completed_.empty()) run_completed(lock);
}

bool Messenger::test(RequestImpl& request) {
  if (!request.done.load(std::memory_order_acquire)) progress();
  return request.done.load(std::memory_order_acquire);
}

bool Messenger::take_driver_role() {
  if (closing_.load(std::memory_order_relaxed) != 0 || driving_.load(std::memory_order_relaxed) ||
      driving_.exchange(true, std::memory_order_acquire)) {
    return false;
  }
  driver_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  return true;
}

void Messenger::release_driver_role() {
  driver_.store(std::thread::id{}, std::memory_order_relaxed);
  // Pairs with the sleepers' increment-then-check under mu_ in wait(): either they see the
  // role free, or we see them and wake them.
  driving_.store(false, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    Lock lock(mu_);
    cv_.notify_all();
  }
}

void Messenger::progress() {
  if (!take_driver_role()) {
    kick_background();
    return;
  }
  drive(0, true);
  release_driver_role();
}

Status Messenger::wait(RequestImpl& request, std::chrono::milliseconds timeout) {
  if (request.done.load(std::memory_order_acquire)) {  // no clock, no lock
    if (request.error) throw *request.error;
    return request.status;
  }
  // "Forever" (milliseconds::max()) would overflow the clock into a deadline in the past.
  timeout = std::clamp(timeout, std::chrono::milliseconds(0), base::longest_timeout);
  if (request.kind == RequestImpl::Kind::external) return wait_external(request, timeout);
  // The clock starts after a first burst of rounds that read none: most waits for a peer
  // that is already sending end within it (a clock read costs as much as a round).
  base::Deadline deadline{}, spin_end{}, pure_spin_end{};
  bool clock_started = false;
  // The hang doctor's watch over a user's request (a collective's steps have their own).
  const bool watched = watchdog_.count() > 0 && to_underlying(request.tag) < reserved_tags;
  base::Clock::time_point started{}, next_watch = base::Clock::time_point::max();
  auto start_clock = [&] {
    if (clock_started) return;
    clock_started = true;
    const auto start = base::Clock::now();
    started = start;
    if (watched) next_watch = start + watchdog_;
    deadline = start + timeout;
    spin_end = start + spin_;
    pure_spin_end = start + spin_ / 2;
  };
  auto timed_out = [&] {  // called without mu_, which guards what it reads
    Lock lock(mu_);
    return request_error(
        request, ErrorKind::timeout,
        "not complete after " + std::to_string(timeout.count()) + " ms: " + describe_wait(request));
  };
  auto done = [&] { return request.done.load(std::memory_order_acquire); };
  bool wants_role = false;
  struct RoleWish {  // withdrawn however the wait ends
    bool& wants;
    std::atomic<int>& wanted;
    ~RoleWish() {
      if (wants) wanted.fetch_sub(1);
    }
  } wish{wants_role, role_wanted_};
  // Past the next watch point (never when not watched): report, and set the next.
  auto watch = [&](base::Clock::time_point now) {
    if (now < next_watch || done()) return;
    next_watch = now + watchdog_;
    report_stall(request, std::chrono::duration_cast<std::chrono::milliseconds>(now - started));
  };
  while (!done()) {
    if (!take_driver_role()) {
      // Someone else drives progress (and completes our request too); sleep until a
      // completion or until the role is free. The background thread gives the role up.
      start_clock();
      if (!wants_role && background_on_.load(std::memory_order_relaxed)) {
        wants_role = true;
        role_wanted_.fetch_add(1);
        kick_background();
      }
      {
        Lock lock(mu_);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        if (driving_.load(std::memory_order_seq_cst) && !done())
          cv_.wait_for(lock, std::chrono::milliseconds(1));
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
      }
      const auto now = base::Clock::now();
      if (!done() && now >= deadline) throw timed_out();
      watch(now);
      continue;
    }
    for (int round = 0; !clock_started && round < fast_rounds && !done(); ++round) drive(0);
    start_clock();
    // Spin (busy-poll class latency), then yield to other runnable ranks, then sleep in the
    // kernel: an idle waiter uses no CPU. The clock is read every few spins only. Even while
    // spinning purely, the waiter yields now and then: when ranks (or other work) outnumber
    // the cores, the peer it waits for may need this very core.
    auto now = base::Clock::now();
    auto next_yield = now + yield_interval;
    bool gave_up_role = false;
    for (unsigned spins = 1; !done() && now < deadline; ++spins) {
      const bool spinning = now < spin_end;
      drive(spinning ? 0 : base::ms_left(deadline, 100));
      if (closing_.load(std::memory_order_relaxed) != 0) {  // shutdown() waits for the role
        release_driver_role();
        gave_up_role = true;
        break;
      }
      if (spinning && spins % 16 != 0) continue;
      now = base::Clock::now();
      if (!spinning && now >= next_watch) {
        release_driver_role();  // the report takes locks and may write a file
        watch(now);
        if (!take_driver_role()) {  // another thread drives now: wait as a sleeper
          gave_up_role = true;
          break;
        }
        continue;
      }
      if (spinning && (now >= pure_spin_end || now >= next_yield) && !done()) {
        std::this_thread::yield();
        next_yield = now + yield_interval;
      }
    }
    if (gave_up_role) continue;
    release_driver_role();
    if (!done()) throw timed_out();
  }
  if (request.error) throw *request.error;
  return request.status;
}

// An external request (a nonblocking collective) is completed by the thread that runs it,
// which drives the progress it needs itself; or by the waiter, when the operation has not
// started and is next in line (RequestImpl::run_here). A waiter that drove or spun would take
// the driver role and a core from that very thread: with more busy threads than cores (two
// ranks, each with a waiting and a working thread, on two cores) every call then costs a
// scheduler time slice. So the waiter only yields for the spin time (a short collective ends
// meanwhile), then sleeps until the completion wakes it.
Status Messenger::wait_external(RequestImpl& request, std::chrono::milliseconds timeout) {
  auto done = [&] { return request.done.load(std::memory_order_acquire); };
  // Next in line and not started: run it here (as a blocking collective would run).
  auto ran_here = [&] { return request.run_here && !done() && request.run_here(); };
  const auto start = base::Clock::now();
  const base::Deadline deadline = start + timeout;
  for (auto now = start; !done() && !ran_here() && now < start + spin_ && now < deadline;
       now = base::Clock::now())
    std::this_thread::yield();
  if (!done()) {
    Lock lock(mu_);  // complete() sets done under mu_: no wake-up is lost
    while (!done()) {
      if (base::Clock::now() >= deadline)
        throw request_error(request, ErrorKind::timeout,
                            "not complete after " + std::to_string(timeout.count()) +
                                " ms: " + describe_wait(request));
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      cv_.wait_until(lock, deadline);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }
  }
  if (request.error) throw *request.error;
  return request.status;
}

RequestPtr Messenger::external_request(std::string operation) {
  auto req = new_request(shared_from_this(), RequestImpl::Kind::external, -1, Tag{0});
  req->operation = std::move(operation);
  req->status.source = config_.rank;
  return req;
}

void Messenger::finish_external(const RequestPtr& request, std::optional<Error> error,
                                std::size_t bytes) {
  Completions completed;
  {
    Lock lock(mu_);
    request->status.bytes = bytes;
    complete(request, std::move(error));
    take_completed(completed);
  }
  run_callbacks(completed);
  wake_driver();
}

void Messenger::wake_driver() {
  // The thread that drives progress may sleep in epoll (up to 100 ms a round) while its
  // waiter's request is among those just completed here: it must look at it again.
  if (driving_.load(std::memory_order_seq_cst) &&
      driver_.load(std::memory_order_relaxed) != std::this_thread::get_id()) {
    engine_.wakeup();
  }
}

void Messenger::report_stall(const RequestImpl& request, std::chrono::milliseconds waited) {
  std::string text;
  {
    Lock lock(mu_);
    if (request.done.load(std::memory_order_acquire)) return;
    const bool recv = request.kind == RequestImpl::Kind::recv;
    const int peer = request.peer;
    const char* name = recv                                      ? "recv"
                       : request.kind == RequestImpl::Kind::send ? "send"
                       : request.kind == RequestImpl::Kind::put  ? "put"
                       : request.kind == RequestImpl::Kind::get  ? "get"
                                                                 : "flush";
    text =
        "hang doctor: " + std::string(name) + " tag=" +
        (request.tag == any_tag ? std::string("any") : std::to_string(to_underlying(request.tag))) +
        (recv ? " from " : " to ") +
        (peer == any_source ? std::string("any rank") : "rank " + std::to_string(peer)) +
        " has waited " + std::to_string(waited.count() / 1000) + "." +
        std::to_string(waited.count() % 1000 / 100) + " s on rank " + std::to_string(config_.rank) +
        ": " + describe_wait(request);
    if (peer >= 0 && peer < size() && peers_[static_cast<std::size_t>(peer)].transport != nullptr)
      text += "; link: " + peers_[static_cast<std::size_t>(peer)].transport->describe_peer(peer);
  }
  base::log("p2p", base::LogLevel::warn, text);
  if (stall_hook_) stall_hook_(text);
}

std::string Messenger::describe_wait(const RequestImpl& r) const {
  if (r.kind == RequestImpl::Kind::external) return r.operation + " has not finished";
  const std::string peer = r.peer == any_source ? "any rank" : "rank " + std::to_string(r.peer);
  switch (r.kind) {
    case RequestImpl::Kind::put:
      return std::to_string(r.received) + " of " + std::to_string(r.expected) +
             " bytes acknowledged by " + peer + " (it serves puts from its progress)";
    case RequestImpl::Kind::get:
      return std::to_string(r.received) + " of " + std::to_string(r.expected) +
             " bytes arrived from " + peer + " (it serves gets from its progress)";
    case RequestImpl::Kind::flush:
      return "earlier puts and gets to " + peer + " have not completed";
    default:
      break;
  }
  if (r.kind == RequestImpl::Kind::recv) {
    if (r.phase == RequestImpl::Phase::matched) {
      return "matched a message of " + std::to_string(r.expected) + " bytes from rank " +
             std::to_string(r.status.source) + ", " + std::to_string(r.received) +
             " bytes arrived so far";
    }
    std::string text = "no matching message from " + peer + " has arrived";
    std::string lost;
    for (int p = 0; p < config_.world_size; ++p) {
      const auto& f = peers_[static_cast<std::size_t>(p)].failure;
      if (f && (r.peer == any_source || r.peer == p))
        lost += (lost.empty() ? "" : "; ") + std::string(f->what());
    }
    if (!lost.empty()) text += " (lost earlier: " + lost + ")";
    // With bounded buffering a receive can wait for a message stuck behind unreceived ones:
    // say so, with the way out.
    for (int p = 0; p < config_.world_size; ++p) {
      const PeerState& ps = peers_[static_cast<std::size_t>(p)];
      if (!ps.deferred || (r.peer != any_source && r.peer != p)) continue;
      text += "; reading from rank " + std::to_string(p) +
              " is paused: " + std::to_string(ps.unexpected_bytes) +
              " bytes of its messages (with 64 per message for its queue entry) wait for "
              "matching receives (post them, or raise ANVIEW_UNEXPECTED_BYTES)";
    }
    return text;
  }
  if (r.phase == RequestImpl::Phase::transferring)
    return std::to_string(r.chunks_pending) + " data chunks still queued for " + peer;
  if (r.id != 0) return "waiting for " + peer + " to post a matching receive (clear-to-send)";
  return "queued behind other data: " + peer + " is not reading fast enough";
}

bool Messenger::cancel(const RequestPtr& ref) {
  RequestImpl& request = *ref;
  Completions completed;
  bool cancelled = false;
  {
    Lock lock(mu_);
    if (request.kind == RequestImpl::Kind::recv && request.phase == RequestImpl::Phase::posted) {
      if (posted_.remove(request)) {
        complete(request, request_error(request, ErrorKind::usage, "cancelled"), ref);
        cancelled = true;
      }
    }
    take_completed(completed);
  }
  run_callbacks(completed);
  if (cancelled) wake_driver();
  return cancelled;
}

bool Messenger::abandon(const RequestPtr& ref, const Error& error) {
  if (cancel(ref)) return true;
  RequestImpl& request = *ref;
  Completions completed;
  {
    Lock lock(mu_);
    if (request.phase == RequestImpl::Phase::complete) return false;
    const int peer = request.kind == RequestImpl::Kind::recv ? request.status.source : request.peer;
    if (peer >= 0 && peers_[static_cast<std::size_t>(peer)].transport) {
      base::log("p2p", base::LogLevel::error, error.what(), "; closing the link to rank ", peer,
                " because the operation cannot be taken back otherwise");
      peers_[static_cast<std::size_t>(peer)].transport->fail_peer(peer, error);
    }
    complete(request, error, ref);
    take_completed(completed);
  }
  run_callbacks(completed);
  wake_driver();
  return true;
}

bool Messenger::take_driver_role_to_close(base::Deadline deadline) {
  // closing_ stays raised until the close is over (shutdown() lowers it), also where the role
  // never came: a thread that frees it later gives it up again at its next round.
  closing_.fetch_add(1, std::memory_order_seq_cst);
  while (driving_.load(std::memory_order_relaxed) ||
         driving_.exchange(true, std::memory_order_acquire)) {
    if (base::Clock::now() >= deadline) {
      base::log("p2p", base::LogLevel::warn, "rank ", config_.rank,
                ": close: another thread of this rank still drives progress (a completion "
                "callback that does not return?); closing beside it");
      return false;
    }
    engine_.wakeup();  // out of its sleep in epoll, to see closing_
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  driver_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  return true;
}

void Messenger::shutdown() {
  stop_background_progress();
  const auto linger = std::min<std::chrono::milliseconds>(config_.timeout, shutdown_linger);
  // The transports' shutdown drives the engine (flushes, goodbyes), which only the driver
  // may: beside a thread that drives it (one waiting on a Request of this communicator), the
  // two would fill the engine's one event buffer at once, and one would dispatch events the
  // other collected, for connections closed meanwhile. A completion callback that closes runs
  // on the thread that holds the role already.
  const bool role_here = driving_.load(std::memory_order_relaxed) &&
                         driver_.load(std::memory_order_relaxed) == std::this_thread::get_id();
  struct Role {
    Messenger& m;
    bool asked;  // closing_ was raised for this close
    bool taken;
    ~Role() {
      if (taken) m.release_driver_role();
      if (asked) m.closing_.fetch_sub(1, std::memory_order_relaxed);
    }
  } role{*this, !role_here, !role_here && take_driver_role_to_close(base::deadline_after(linger))};
  Completions completed;
  {
    Lock lock(mu_);
    if (closed_) return;
    closed_ = true;
    // The transports' own linger (flushes, goodbyes, peers' reads of our memory) starts now,
    // whatever the wait for the role took.
    const base::Deadline deadline = base::deadline_after(linger);
    for (auto& t : transports_) t->shutdown(deadline);
    self_->shutdown(deadline);
    auto fail = [&](const RequestPtr& r) {
      complete(r, request_error(*r, ErrorKind::usage, "the communicator was closed"));
    };
    for (auto& r : posted_.take_all()) fail(r);
    for (auto& [id, r] : sends_) fail(r);
    for (auto& [id, r] : recvs_) fail(r);
    for (auto& ps : peers_) {
      if (ps.eager_target) fail(ps.eager_target);
      fail_rma(ps, Error(ErrorKind::usage, {.rank = config_.rank,
                                            .operation = "shutdown",
                                            .cause = "the communicator was closed"}));
    }
    for (int r = 0; r < config_.world_size; ++r)
      for (auto& u : unexpected_.from(r))
        if (u.waiting) fail(u.waiting);
    sends_.clear();
    recvs_.clear();
    unexpected_.clear();
    for (auto& ps : peers_) ps.eager_target.reset();
    for (auto& [token, w] : withdrawals_) complete(w.request, std::nullopt);  // nobody writes now
    take_completed(completed);
  }
  run_callbacks(completed);
}

const transport::PeerMemory* Messenger::peer_memory(int peer) const {
  Lock lock(mu_);
  if (peer == config_.rank || closed_) return nullptr;
  const PeerState& ps = peers_.at(static_cast<std::size_t>(peer));
  if (ps.transport == nullptr || ps.failure) return nullptr;
  return ps.transport->peer_memory(peer);
}

transport::SharedArea Messenger::own_area() const {
  Lock lock(mu_);
  for (const auto& t : transports_)
    if (const auto area = t->own_area(); area.data != nullptr) return area;
  return {};
}

const char* Messenger::peer_area(int peer) const {
  Lock lock(mu_);
  if (peer == config_.rank || closed_) return nullptr;
  const PeerState& ps = peers_.at(static_cast<std::size_t>(peer));
  if (ps.transport == nullptr || ps.failure) return nullptr;
  return ps.transport->peer_area(peer);
}

std::string Messenger::transport_name(int peer) const {
  Lock lock(mu_);
  const auto* t = peers_.at(static_cast<std::size_t>(peer)).transport;
  return t ? std::string(t->name()) : "none";
}

std::string Messenger::describe_peer(int peer) const {
  Lock lock(mu_);
  const PeerState& ps = peers_.at(static_cast<std::size_t>(peer));
  if (ps.transport == nullptr) return "not connected";
  return ps.transport->describe_peer(peer) + "; chosen as " + ps.transport_reason;
}

std::string Messenger::describe_request(const RequestImpl& request) const {
  Lock lock(mu_);
  return describe_wait(request);
}

Messenger::PendingSummary Messenger::pending(std::size_t limit) const {
  const auto phase_name = [](RequestImpl::Phase p) {
    switch (p) {
      case RequestImpl::Phase::posted:
        return "posted";
      case RequestImpl::Phase::matched:
        return "matched";
      case RequestImpl::Phase::transferring:
        return "transferring";
      case RequestImpl::Phase::complete:
        return "complete";
    }
    return "?";
  };
  const auto entry = [&](const RequestImpl& r) {
    const bool recv = r.kind == RequestImpl::Kind::recv;
    const auto tag = static_cast<std::uint64_t>(r.tag);
    return PendingRequest{recv ? "recv" : "send",
                          r.peer,
                          tag,
                          recv ? r.capacity : r.send_bytes,
                          phase_name(r.phase),
                          tag >= reserved_tags && r.tag != any_tag};
  };
  Lock lock(mu_);
  PendingSummary out;
  for (const auto& r : posted_.snapshot(limit)) out.requests.push_back(entry(*r));
  for (const auto* map : {&recvs_, &sends_}) {
    for (const auto& [id, r] : *map) {
      if (out.requests.size() >= limit) break;
      out.requests.push_back(entry(*r));
    }
  }
  for (int p = 0; p < size(); ++p) {
    out.unexpected_bytes += peers_[static_cast<std::size_t>(p)].unexpected_bytes;
    out.unexpected_messages += unexpected_.from(p).size();
  }
  return out;
}

std::optional<Error> Messenger::first_peer_failure() const {
  Lock lock(mu_);
  for (const PeerState& ps : peers_)
    if (ps.failure && !ps.left) return ps.failure;
  return std::nullopt;
}

std::optional<Error> Messenger::peer_failure(int peer) const {
  Lock lock(mu_);
  return peers_.at(static_cast<std::size_t>(peer)).failure;
}

std::string Messenger::transport_reason(int peer) const {
  Lock lock(mu_);
  return peers_.at(static_cast<std::size_t>(peer)).transport_reason;
}

}  // namespace anview::p2p
