#include "transport/shm/shm_transport.hpp"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "base/config.hpp"
#include "base/huge_pages.hpp"
#include "base/limits.hpp"
#include "base/log.hpp"
#include "base/shared_segment.hpp"
#include "bootstrap/interfaces.hpp"
#include "transport/cross_memory.hpp"

namespace anview::transport::shm {
namespace {

const base::Setting ring_setting(
    "shm", "ANVIEW_SHM_RING", "512K",
    "Bytes of each shared-memory ring (one per direction and same-host peer pair; a power of "
    "two, 64K-1G); pages are touched only for peers that talk");
const base::Setting cma_setting(
    "shm", "ANVIEW_SHM_CMA", "1",
    "Large shared-memory messages are read straight from the sender's buffer with cross-memory "
    "attach where the kernel allows it (0: always copy through the ring)");
const base::Setting single_copy_setting(
    "shm", "ANVIEW_SHM_SINGLE_COPY_BYTES", "64K",
    "Payloads larger than this go single-copy (cross-memory attach); smaller ones through the "
    "ring");

const base::Setting split_setting(
    "shm", "ANVIEW_SHM_SPLIT_BYTES", "256K",
    "Single-copy payloads at least this large are copied by both processes at once (the "
    "receiver reads one half, the sender writes the other); 0: the receiver copies alone");

std::atomic<unsigned> instance_counter{0};

std::size_t checked_ring_bytes(int rank) {
  const auto bytes = ring_setting.as_int();
  if (bytes < (64 << 10) || bytes > (1 << 30) || (bytes & (bytes - 1)) != 0) {
    throw Error(ErrorKind::usage, {.rank = rank,
                                   .operation = "shm.init",
                                   .cause = "ANVIEW_SHM_RING=" + ring_setting.value() +
                                            " is not a power of two between 64K and 1G"});
  }
  return static_cast<std::size_t>(bytes);
}

// CAP_SYS_PTRACE in the effective set lets a rank read its siblings whatever Yama says.
bool has_cap_sys_ptrace() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    try {
      return (std::stoull(line.substr(7), nullptr, 16) >> 19) & 1;  // CAP_SYS_PTRACE = 19
    } catch (const std::exception&) {
      return false;
    }
  }
  return false;
}

// What kernel.yama.ptrace_scope means for ranks reading their siblings (they are siblings under
// every launcher, never parent and child).
std::string ptrace_note() {
  std::ifstream file("/proc/sys/kernel/yama/ptrace_scope");
  int scope = -1;
  if (!(file >> scope)) {
    return "kernel.yama.ptrace_scope: no Yama here; ranks of the same user may read each other";
  }
  const std::string head = "kernel.yama.ptrace_scope=" + std::to_string(scope) + ": ";
  const bool cap = has_cap_sys_ptrace();
  if (scope == 0) return head + "ranks of the same user may read each other";
  if (scope <= 2 && cap) return head + "restricted, but this process has CAP_SYS_PTRACE";
  std::string text = head + (scope == 1   ? "only a process's descendants may read it"
                             : scope == 2 ? "only processes with CAP_SYS_PTRACE may read others"
                                          : "no process may read another");
  text +=
      ", so sibling ranks are refused single copy and large messages are copied through the "
      "ring (the transport says so at connect time)";
  if (scope <= 2) text += "; for single copy set it to 0 or give the ranks CAP_SYS_PTRACE";
  return text;
}

}  // namespace

TransportProbe ShmTransport::probe() {
  TransportProbe p{.name = "shm"};
  std::string why;
  if (!usable_here(&why)) {
    p.detail = "cannot run here: " + why;
    return p;
  }
  p.usable = true;
  p.detail =
      "memfd, shared mappings and unix wake-up sockets work; reaches the ranks whose host "
      "id is " +
      bootstrap::host_id();
  // The same probe a connection makes towards a peer, aimed at this very process: whether the
  // kernel and a seccomp profile allow cross-memory attach at all (Yama may still refuse
  // siblings, see ptrace_note).
  const std::uint64_t word = probe_value;
  if (!cma_setting.as_bool()) {
    p.notes.push_back("single copy (cross-memory attach): off (ANVIEW_SHM_CMA=" +
                      cma_setting.value() + "); large messages are copied through the ring");
  } else if (!probe_cross_memory_attach(static_cast<int>(::getpid()),
                                        reinterpret_cast<std::uint64_t>(&word), &why)) {
    p.notes.push_back("single copy: unavailable (" + why +
                      "); large messages are copied through the ring");
  } else {
    p.notes.push_back("single copy (cross-memory attach) above ANVIEW_SHM_SINGLE_COPY_BYTES=" +
                      single_copy_setting.value() + ": process_vm_readv works on this process");
    // The copy pins and walks pages: 2 MiB pages on both sides make it about twice as fast.
    const std::string policy = base::huge_page_policy();
    const bool malloc_asks =
        base::glibc_tunable(std::getenv("GLIBC_TUNABLES"), base::malloc_huge_pages_tunable) == "1";
    p.notes.push_back(
        "large messages copy about twice as fast between buffers in 2 MiB pages on both sides "
        "(anview::HostBuffer, or malloc with GLIBC_TUNABLES=glibc.malloc.hugetlb=1, which "
        "anview-run gives its ranks unless --no-huge-pages; this process's malloc " +
        std::string(malloc_asks ? "asks for them" : "does not") +
        "); transparent huge pages here: " + policy +
        (base::advised_memory_gets_huge_pages(policy) ? ""
         : policy == "unavailable"                    ? " (HostBuffer may get plain pages)"
                                                      : " (HostBuffer gets plain pages)"));
  }
  p.notes.push_back(ptrace_note());
  return p;
}

bool ShmTransport::usable_here(std::string* why) {
  // What the transport does with its segment: a sealed memfd, mapped.
  const base::Fd fd = base::sealed_memfd("anview-probe", page_bytes, why);
  if (!fd.valid() || !map_shared(fd.get(), 0, page_bytes, why)) return false;
  const int sock = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (sock < 0) {
    if (why) *why = "unix datagram socket: " + base::errno_text(errno);
    return false;
  }
  ::close(sock);
  return true;
}

ShmTransport::ShmTransport(const TransportContext& context)
    : context_(context),
      ring_bytes_(checked_ring_bytes(context.rank)),
      max_frame_(base::limits::max_frame_bytes()),
      single_copy_bytes_(static_cast<std::size_t>(single_copy_setting.as_int())),
      single_copy_wanted_(cma_setting.as_bool()),
      split_bytes_(static_cast<std::size_t>(split_setting.as_int())),
      peers_(static_cast<std::size_t>(context.world_size)) {
  // A machine without memfd or unix sockets is not an error: can_reach says why, and the
  // next transport in ANVIEW_TRANSPORTS serves the peers. (Each step below says why it failed,
  // so there is no separate usable_here() probe at start-up.)
  // Its size sealed: a peer maps it, and must not be able to shrink it under our mapping.
  const std::size_t bytes = area_offset(context.world_size, ring_bytes_) + area_bytes;
  std::string why;
  segment_ = base::sealed_memfd("anview-shm", bytes, &why);
  if (!segment_.valid()) {
    unusable_ = "cannot create a segment of " + std::to_string(bytes) + " bytes: " + why;
    return;
  }
  own_control_page_ = map_shared(segment_.get(), 0, page_bytes, &unusable_);
  if (!own_control_page_) return;
  own_control_ = new (own_control_page_.data()) SegmentControl{};
  own_control_->magic = segment_magic;
  own_control_->version = segment_version;
  own_control_->slots = static_cast<std::uint32_t>(context.world_size);
  own_control_->ring_bytes = ring_bytes_;
  own_control_->area_bytes = static_cast<std::uint32_t>(area_bytes);
  own_area_ = map_shared(segment_.get(), area_offset(context.world_size, ring_bytes_), area_bytes,
                         &unusable_);
  if (!own_area_) {
    own_control_ = nullptr;
    return;
  }
  own_control_->sleeping.store(0, std::memory_order_relaxed);

  wake_socket_ = base::Fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  wake_name_ = "anview-" + to_hex(context.job_id) + "-" + std::to_string(context.rank) + "-" +
               std::to_string(::getpid()) + "-" + std::to_string(instance_counter++);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, wake_name_.data(), wake_name_.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + wake_name_.size());
  if (!wake_socket_.valid() ||
      ::bind(wake_socket_.get(), reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
    unusable_ = "cannot bind the wake-up socket @" + wake_name_ + ": " + base::errno_text(errno);
    own_control_ = nullptr;
    return;
  }
  context_.engine->add_fd(wake_socket_.get(), EPOLLIN, this);
  context_.engine->add_poller([this] { return poll(); }, [this] { return has_work(); });
  context_.engine->add_sleep_hooks([this] { return before_sleep(); }, [this] { after_wake(); });
}

ShmTransport::~ShmTransport() {
  if (wake_socket_.valid() && own_control_ != nullptr)
    context_.engine->remove_fd(wake_socket_.get());
}

Capabilities ShmTransport::capabilities() const {
  return Capabilities{.zero_copy_receive = single_copy_wanted_,
                      .one_sided = single_copy_wanted_,
                      .streams = 1,
                      .fd_driven = false,
                      .latency_us = 0.2,
                      .bandwidth_gbs = 10.0};
}

void ShmTransport::describe_self(PeerInfo& self) const {
  if (!unusable_.empty()) return;
  self.endpoints["shm"] =
      encode_endpoint(Endpoint{.pid = static_cast<int>(::getpid()),
                               .segment_fd = segment_.get(),
                               .ring_bytes = ring_bytes_,
                               .wake_name = wake_name_,
                               .probe_address = reinterpret_cast<std::uint64_t>(&probe_)});
}

bool ShmTransport::can_reach(const PeerInfo& peer, std::string* why) const {
  auto say = [why](std::string text) {
    if (why) *why = std::move(text);
    return false;
  };
  if (!unusable_.empty()) return say("not usable here: " + unusable_);
  if (peer.host_id != context_.host_id) return say("on another host (" + peer.host_id + ")");
  const auto it = peer.endpoints.find("shm");
  if (it == peer.endpoints.end()) return say("it does not offer shared memory");
  Endpoint e;
  return decode_endpoint(it->second, e, why);
}

ErrorContext ShmTransport::error_context(int peer, const std::string& operation) const {
  return ErrorContext{
      .rank = context_.rank, .peer = peer, .peer_address = "shm", .operation = operation};
}

Error ShmTransport::closed_communicator(int peer) const {
  ErrorContext ctx = error_context(peer, "transfer");
  ctx.cause = "rank " + std::to_string(peer) + " closed its communicator";
  return Error(ErrorKind::peer_lost, std::move(ctx));
}

void ShmTransport::setup_error(int peer, const std::string& cause) {
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  ErrorContext ctx = error_context(peer, "connect");
  ctx.cause = "cannot attach to rank " + std::to_string(peer) + " over shared memory: " + cause;
  link.setup_error = Error(ErrorKind::link, std::move(ctx));
  link.failed = true;
  base::log("shm", base::LogLevel::error, link.setup_error->what());
}

void ShmTransport::connect(const std::vector<PeerInfo>& peers) {
  std::string refused;  // the first reason single copy is off, for one summary line
  int refused_count = 0;
  for (const auto& peer : peers) {
    PeerLink& link = peers_[static_cast<std::size_t>(peer.rank)];
    link.served = true;
    Endpoint endpoint;
    std::string why;
    if (!decode_endpoint(peer.endpoints.at("shm"), endpoint, &why)) {
      setup_error(peer.rank, why);
      continue;
    }
    link.conn = std::make_unique<Connection>(*this, peer.rank, endpoint);
    if (!link.conn->attach(segment_.get(), ring_bytes_, single_copy_wanted_, &why)) {
      setup_error(peer.rank, why);
      link.conn.reset();
      continue;
    }
    if (link.conn->reads_by_reference()) {
      link.memory = std::make_unique<CrossMemoryAccess>(context_.rank, peer.rank, endpoint.pid);
    } else {
      if (refused.empty()) refused = link.conn->single_copy_note();
      ++refused_count;
    }
    const int rank = peer.rank;
    bool gone = false;
    link.conn->exit_watch = base::ProcessWatch::start(
        *context_.engine, endpoint.pid, [this, rank] { on_peer_process_exit(rank); }, &why, &gone);
    if (gone) {
      setup_error(rank, "its process (pid " + std::to_string(endpoint.pid) + ") has exited");
      continue;
    }
    if (!link.conn->exit_watch)
      base::log("shm", base::LogLevel::debug, "shm: cannot watch rank ", rank, ": ", why);
    active_.push_back(link.conn.get());
  }
  if (refused_count > 0) {
    base::log(
        "shm", single_copy_wanted_ ? base::LogLevel::warn : base::LogLevel::info,
        "shm: ", refused_count, " of ", peers.size(),
        " same-host peers get large messages copied through the ring, not single-copy: ", refused);
  }
}

bool ShmTransport::ready() const {
  for (const auto& link : peers_)
    if (link.served && !link.failed && !link.was_up) return false;
  return true;
}

std::optional<Error> ShmTransport::setup_failure() const {
  for (const auto& link : peers_)
    if (link.setup_error) return link.setup_error;
  return std::nullopt;
}

std::string ShmTransport::pending_connections() const {
  std::string text;
  for (std::size_t r = 0; r < peers_.size(); ++r) {
    const PeerLink& link = peers_[r];
    if (!link.served || link.failed || link.was_up) continue;
    if (!text.empty()) text += ", ";
    text += "rank " + std::to_string(r) + " (shm: it has not attached to our segment yet)";
  }
  return text;
}

void ShmTransport::post_send(int peer, const FrameHeader& header, const void* payload,
                             Ordering ordering, SendDone done) {
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  if (link.failed || !link.conn || link.conn->state() != Connection::State::up) {
    ErrorContext ctx = error_context(peer, "send");
    ctx.cause = link.failed
                    ? "the shared-memory link to rank " + std::to_string(peer) + " is closed"
                    : "the shared-memory link to rank " + std::to_string(peer) + " is not up";
    const Error error(link.failed ? ErrorKind::peer_lost : ErrorKind::internal, std::move(ctx));
    if (done) done(&error);
    return;
  }
  link.conn->send(header, payload, ordering, std::move(done));
}

bool ShmTransport::try_send_now(int peer, const FrameHeader& header, const void* payload) {
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  return !link.failed && link.conn && link.conn->try_send_now(header, payload);
}

void ShmTransport::resume(int peer) {
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  if (link.conn) link.conn->resume();
}

bool ShmTransport::poll() {
  bool worked = false;
  for (std::size_t i = 0; i < active_.size(); ++i) {
    Connection* conn = active_[i];
    if (conn->state() == Connection::State::connecting) {
      std::string why;
      if (!conn->check_up(&why)) {
        if (!why.empty()) {
          PeerLink& link = peers_[static_cast<std::size_t>(conn->peer())];
          setup_error(conn->peer(), why);
          link.conn->close(*link.setup_error);
        }
        continue;
      }
      peers_[static_cast<std::size_t>(conn->peer())].was_up = true;
      worked = true;
    }
    if (conn->state() != Connection::State::up) continue;
    worked |= conn->receive(true);
    if (conn->state() == Connection::State::up && conn->goodbye_received()) {
      fail_link(conn->peer(), closed_communicator(conn->peer()));
      continue;
    }
    if (conn->state() == Connection::State::up) worked |= conn->flush();
    // The peer gave up the link (after a failure of its own) and we read all it wrote.
    // (The flag first: it is read from a line that stays put, the ring from lines that move.)
    if (conn->state() == Connection::State::up && conn->peer_closed()) {
      if (auto closed = conn->peer_closed_error()) {
        // Nothing more will come: what the peer wrote before is taken now, past the
        // unexpected-message budget, rather than when the user's receives drain the ring
        // (until then the link looked up, and receives from the peer waited their timeout).
        if (!conn->drained()) {
          conn->resume();
          conn->receive(false);
        }
        if (conn->state() == Connection::State::up && conn->drained())
          fail_link(conn->peer(), *closed);
      }
    }
  }
  return worked;
}

bool ShmTransport::has_work() const {
  for (const Connection* conn : active_)
    if (conn->state_hint_work()) return true;
  return false;
}

bool ShmTransport::before_sleep() {
  own_control_->sleeping.store(1, std::memory_order_seq_cst);
  for (const Connection* conn : active_)
    if (conn->work_pending()) return false;
  return true;
}

void ShmTransport::after_wake() {
  own_control_->sleeping.store(0, std::memory_order_relaxed);
}

void ShmTransport::on_fd_events(std::uint32_t) {
  char buffer[64];
  while (::recv(wake_socket_.get(), buffer, sizeof buffer, MSG_DONTWAIT) > 0) {
  }
}

void ShmTransport::on_peer_process_exit(int peer) {
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  if (link.failed || !link.conn) return;
  Connection& conn = *link.conn;
  const bool up = conn.state() == Connection::State::up;
  // Whatever it published before it died is in the ring: deliver it, past any budget.
  if (up) {
    conn.resume();
    conn.receive(false);
  }
  if (link.failed) return;
  if (conn.goodbye_received()) {
    fail_link(peer, closed_communicator(peer));
    return;
  }
  ErrorContext ctx = error_context(peer, up ? "transfer" : "connect");
  ctx.cause = "the process of rank " + std::to_string(peer) + " (pid " +
              std::to_string(conn.endpoint().pid) +
              ") exited without closing its communicator: it was killed or crashed";
  fail_link(peer, Error(ErrorKind::peer_lost, std::move(ctx)));
}

void ShmTransport::fail_link(int peer, const Error& error) {
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  if (link.failed) return;
  link.failed = true;
  if (!link.was_up) link.setup_error = error;
  const bool left = link.conn && link.conn->goodbye_received();
  const bool quiet = closing_ || left;
  base::log("shm", quiet ? base::LogLevel::debug : base::LogLevel::error,
            quiet ? "shm: link closed: " : "", error.what());
  if (link.conn) {
    link.conn->close(error);  // uses the exit watch to tell a dead peer from a slow one
    link.conn->exit_watch.reset();
  }
  if (!closing_) context_.sink->on_peer_failed(peer, error, left);
}

const PeerMemory* ShmTransport::peer_memory(int peer) const {
  if (peer < 0 || static_cast<std::size_t>(peer) >= peers_.size()) return nullptr;
  return peers_[static_cast<std::size_t>(peer)].memory.get();
}

SharedArea ShmTransport::own_area() {
  return own_area_ ? SharedArea{own_area_.data(), area_bytes} : SharedArea{};
}

const char* ShmTransport::peer_area(int peer) const {
  if (peer < 0 || static_cast<std::size_t>(peer) >= peers_.size()) return nullptr;
  const PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  return link.conn && link.was_up ? link.conn->peer_area() : nullptr;
}

void ShmTransport::fail_peer(int peer, const Error& error) {
  fail_link(peer, error);
}

void ShmTransport::shutdown(base::Deadline deadline) {
  closing_ = true;
  // Deliver what is queued and wait until peers read what they read from our memory (their
  // reads would fail, or read freed memory, once we return), then say goodbye.
  auto settled = [this] {
    for (const Connection* conn : active_)
      if (conn->state() == Connection::State::up && !conn->settled()) return false;
    return true;
  };
  while (!settled() && base::Clock::now() < deadline) {
    if (!context_.engine->poll(0)) std::this_thread::yield();
  }
  for (Connection* conn : active_)
    if (conn->state() == Connection::State::up) conn->say_goodbye();
  while (!settled() && base::Clock::now() < deadline) {
    if (!context_.engine->poll(0)) std::this_thread::yield();
  }
  const Error closed(ErrorKind::link,
                     {.rank = context_.rank, .operation = "send", .cause = "communicator closed"});
  for (Connection* conn : active_)
    if (conn->state() != Connection::State::closed) conn->close(closed);
}

std::string ShmTransport::describe_peer(int peer) const {
  const PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  if (!link.conn) return "shm (not attached)";
  const Connection& c = *link.conn;
  std::string text = "shm ring " + std::to_string(c.endpoint().ring_bytes >> 10) + " KiB, ";
  if (c.peer_reads_by_reference()) {
    text += "single copy (cross-memory attach) above " + std::to_string(single_copy_bytes_ >> 10) +
            " KiB";
  } else {
    text += "large messages pipelined through the ring";
  }
  if (!c.reads_by_reference() && !c.single_copy_note().empty())
    text += "; receiving: " + c.single_copy_note();
  if (link.failed) text += " (closed)";
  return text;
}

}  // namespace anview::transport::shm
