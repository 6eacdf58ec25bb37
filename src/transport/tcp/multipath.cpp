// The TCP transport's links of several paths (tcp_transport.hpp): numbered frames kept until
// acknowledged, data chunks pulled by the streams with room, a failed path's frames sent again
// on the others, duplicates dropped, failed paths probed and re-admitted.
#include <algorithm>
#include <cstring>

#include "base/log.hpp"
#include "transport/tcp/multipath.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace anview::transport::tcp {

void TcpTransport::start_path(int peer, int index) {
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  Path& path = link.paths[static_cast<std::size_t>(index)];
  path.state = Path::State::connecting;
  path.established = 0;
  ++path.generation;
  path.connect_deadline = base::deadline_after(path_connect_timeout);
  path.streams.clear();
  path.streams.resize(static_cast<std::size_t>(stream_count_));
  ErrorContext ctx = error_context(peer, "connect");
  try {
    const auto addr = base::SockAddr::parse(path.plan.remote, ctx);
    std::optional<base::SockAddr> local;
    if (!path.plan.local_ip.empty())
      local = base::SockAddr::from_host_port(path.plan.local_ip, 0, ctx);
    for (int s = 0; s < stream_count_; ++s) {
      base::Fd fd = base::start_connect(addr, local ? &*local : nullptr, ctx);
      configure_socket(fd.get());
      const Handshake hello = make_hello(link, s, index, path.generation);
      auto conn = std::make_unique<Connection>(*this, std::move(fd), Connection::State::connecting,
                                               peer, s, index, &hello, path.plan.remote);
      conn->set_generation(path.generation);
      path.streams[static_cast<std::size_t>(s)] = std::move(conn);
    }
  } catch (const Error& e) {
    path_attempt_failed(peer, index, e.cause());
  }
}

void TcpTransport::path_attempt_failed(int peer, int index, const std::string& cause) {
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  Path& path = link.paths[static_cast<std::size_t>(index)];
  const ErrorContext ctx = error_context(peer, "connect");
  const Error error(ErrorKind::link, ctx);
  close_path_streams(path, error);
  if (!link.was_up) {
    // Start-up: the peer may not listen yet. Try again soon, quietly.
    base::log("tcp", base::LogLevel::debug, "tcp: path ", index, " to rank ", peer, " (",
              path.describe(), ") not up yet: ", cause);
    path.probe_backoff = std::min<std::chrono::milliseconds>(
        std::max(path.probe_backoff * 2, startup_probe), max_startup_probe);
  } else {
    if (path.first_attempt || path.last_failure != cause) {
      base::log("tcp", base::LogLevel::warn, "tcp: path ", index, " to rank ", peer, " (",
                path.describe(), ") did not come up: ", cause, "; probing it again");
    }
    path.settled = true;
    path.probe_backoff = std::min<std::chrono::milliseconds>(
        std::max(path.probe_backoff * 2, first_probe), max_probe);
  }
  path.first_attempt = false;
  path.state = Path::State::failed;
  path.last_failure = cause;
  path.next_probe = base::deadline_after(path.probe_backoff);
}

Landing TcpTransport::deliver_sequenced(Connection& conn, PeerLink& link, const WireHeader& wire,
                                        bool may_defer) {
  const FrameHeader& header = wire.frame;
  const int peer = conn.peer();
  const bool chunk = is_chunk_seq(wire.seq);
  const std::uint64_t number = wire.seq & ~chunk_seq_bit;
  const bool seen = chunk ? link.chunks_started.contains(number) : number <= link.ordered_started;
  if (seen) {
    // Sent again after a path failed: finish a frame that was cut off, drop any other copy.
    auto it = link.interrupted.find(wire.seq);
    if (it != link.interrupted.end()) {
      // The copy lands where the original began: it must be that frame, of that size.
      const FrameHeader& cut = it->second.header;
      if (cut != header) {
        ErrorContext ctx = error_context(peer, "transfer");
        ctx.cause =
            "the copy of frame " + std::to_string(number) + " (cut off when a path failed) " +
            "announces " + std::to_string(header.payload_bytes) + " bytes of type " +
            std::to_string(header.type) + ", the original " + std::to_string(cut.payload_bytes) +
            " bytes of type " + std::to_string(cut.type);
        fail_link(peer, Error(ErrorKind::protocol, std::move(ctx)));
        return {};
      }
      if (it->second.landing != nullptr) return Landing{it->second.landing, false};
      return Landing{conn.discard_landing(header.payload_bytes), false};  // the sink refused it
    }
    link.ack_due = true;  // the sender missed our acknowledgement
    return Landing{conn.duplicate_landing(header.payload_bytes), false};
  }
  if (number == 0 || (!chunk && number != link.ordered_started + 1)) {
    ErrorContext ctx = error_context(peer, "transfer");
    ctx.cause = "ordered frame " + std::to_string(number) + " arrived after frame " +
                std::to_string(link.ordered_started) + " (frames were lost or reordered)";
    fail_link(peer, Error(ErrorKind::protocol, std::move(ctx)));
    return {};
  }
  Landing landing = context_.sink->on_frame(peer, header, may_defer);
  if (landing.defer) return landing;
  if (chunk) {
    link.chunks_started.insert(number);
  } else {
    link.ordered_started = number;
  }
  if (landing.data == nullptr && header.payload_bytes > 0)
    landing.data = conn.discard_landing(header.payload_bytes);  // the sink failed the frame
  return landing;
}

void TcpTransport::on_frame_interrupted(Connection& conn, const WireHeader& wire, char* landing) {
  if (conn.peer() < 0 || wire.seq == 0 || wire.frame.type >= frame_goodbye) return;
  PeerLink& link = peers_[static_cast<std::size_t>(conn.peer())];
  if (link.reliable && !link.failed) link.interrupted[wire.seq] = {wire.frame, landing};
}

void TcpTransport::send_ack(int peer) {
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  Connection* conn = control_frame_stream(link);
  if (conn == nullptr) return;
  link.ack_due = false;
  link.unacked_frames = 0;
  link.unacked_bytes = 0;
  WireHeader ack;
  ack.frame.type = frame_ack;
  ack.frame.tag = link.ordered_done;
  ack.frame.id = link.chunks_done.floor();
  conn->queue_send(ack, nullptr, nullptr);
}

bool TcpTransport::withdraw_copies(PeerLink& link, const Unacked& entry) {
  if (!entry.resent) return false;
  bool dropped = false;
  for (auto& path : link.paths)
    for (auto& conn : path.streams)
      if (conn && conn->withdraw(entry.seq)) dropped = true;
  return dropped;
}

void TcpTransport::on_acknowledged(int peer, std::uint64_t ordered, std::uint64_t chunks) {
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  bool room = false;  // a copy dropped from a stream's queue: chunks may wait for that room
  while (!link.ordered_unacked.empty() && link.ordered_unacked.front().seq <= ordered) {
    room |= withdraw_copies(link, link.ordered_unacked.front());  // they point into its `copy`
    SendDone done = std::move(link.ordered_unacked.front().done);
    link.ordered_unacked.pop_front();
    if (done) done(nullptr);
  }
  std::vector<SendDone> completed;
  while (!link.chunk_unacked.empty() &&
         (link.chunk_unacked.front().seq & ~chunk_seq_bit) <= chunks) {
    room |= withdraw_copies(link, link.chunk_unacked.front());  // before the caller's buffer goes
    completed.push_back(std::move(link.chunk_unacked.front().done));
    link.chunk_unacked.pop_front();
  }
  for (auto& done : completed)
    if (done) done(nullptr);
  if (room && !link.chunk_queue.empty()) feed(peer);
}

void TcpTransport::on_ordered_written(int peer, std::uint64_t seq) {
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  if (link.ordered_unacked.empty() || seq < link.ordered_unacked.front().seq) return;
  const auto index = static_cast<std::size_t>(seq - link.ordered_unacked.front().seq);
  if (index >= link.ordered_unacked.size()) return;
  if (SendDone done = std::move(link.ordered_unacked[index].done)) done(nullptr);
}

bool TcpTransport::other_path_up(const PeerLink& link, int index) const {
  for (std::size_t p = 0; p < link.paths.size(); ++p)
    if (static_cast<int>(p) != index && link.paths[p].state == Path::State::up) return true;
  return false;
}

int TcpTransport::best_control_path(const PeerLink& link) const {
  int best = -1;
  for (std::size_t p = 0; p < link.paths.size(); ++p) {
    const Path& path = link.paths[p];
    if (path.state != Path::State::up) continue;
    if (best < 0 ||
        (path.rtt_us > 0 && path.rtt_us < link.paths[static_cast<std::size_t>(best)].rtt_us))
      best = static_cast<int>(p);
  }
  return best;
}

void TcpTransport::close_path_streams(Path& path, const Error& error) {
  for (auto& conn : path.streams) {
    if (!conn) continue;
    path.retired_bytes += conn->bytes_sent();
    conn->close(&error);
    retire(std::move(conn));
  }
  path.established = 0;
}

void TcpTransport::path_failed(int peer, int index, const std::string& cause, bool tell_peer) {
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  Path& path = link.paths[static_cast<std::size_t>(index)];
  if (path.state == Path::State::failed) return;
  ErrorContext ctx = error_context(peer, "transfer");
  ctx.cause = "path " + std::to_string(index) + " (" + path.describe() + ") failed: " + cause;
  const Error error(ErrorKind::link, ctx);
  close_path_streams(path, error);
  path.state = Path::State::failed;
  path.last_failure = cause;
  ++path.failures;
  path.probe_backoff = first_probe;
  path.next_probe = base::deadline_after(first_probe);
  int left = 0;
  for (const auto& p : link.paths) left += p.state == Path::State::up ? 1 : 0;
  if (left > 0) {
    base::log("tcp", base::LogLevel::warn, "tcp: path ", index, " to rank ", peer, " (",
              path.describe(), ") failed: ", cause, "; its unacknowledged frames go over the ",
              left, " path", left == 1 ? "" : "s", " left");
  }
  if (link.control == index) link.control = best_control_path(link);
  if (tell_peer) {
    // Precede every copy sent again with the news, so the peer closes this path before it
    // can read a copy while the original may still be arriving there.
    path.told_down = true;
    path.down_generation = path.generation;
    for (auto& other : link.paths)
      if (other.state == Path::State::up) tell_path_down(other, index, path.generation);
  }
  // Everything last queued on the failed path goes again, in order.
  std::vector<std::uint64_t> again;
  for (auto& entry : link.chunk_unacked) {
    if (entry.path != index) continue;
    entry.path = -1;
    entry.resent = true;
    again.push_back(entry.seq & ~chunk_seq_bit);
  }
  std::uint64_t resent = again.size();
  link.chunk_queue.insert(link.chunk_queue.begin(), again.begin(), again.end());
  for (auto& entry : link.ordered_unacked) {
    if (entry.path != index) continue;
    entry.path = -1;
    entry.resent = true;
    ++resent;
  }
  path.resent_frames += resent;
  pump_ordered(peer);
  feed(peer);
  // An acknowledgement or a grant lost with the path would leave the peer's sends waiting.
  link.ack_due = true;
  send_ack(peer);
  grants_after_path_failed(link);
}

void TcpTransport::tell_path_down(Path& carrier, int index, std::uint16_t generation) {
  WireHeader down;
  down.frame.type = frame_path_down;
  down.frame.tag = generation;
  down.frame.arg = static_cast<std::uint64_t>(index);
  for (auto& conn : carrier.streams)
    if (conn) conn->queue_send(down, nullptr, nullptr);
}

void TcpTransport::tell_failed_paths(PeerLink& link, int index) {
  Path& carrier = link.paths[static_cast<std::size_t>(index)];
  carrier.told_down = false;  // its new generation replaces the failed one at the peer
  for (std::size_t p = 0; p < link.paths.size(); ++p) {
    Path& failed = link.paths[p];
    if (static_cast<int>(p) == index || !failed.told_down) continue;
    // Generations compare as serial numbers: news far older than the path's own attempts
    // (thousands of probes later) could read as newer than a generation that came back.
    if (static_cast<std::uint16_t>(failed.generation - failed.down_generation) >= 0x4000) {
      failed.told_down = false;
      continue;
    }
    tell_path_down(carrier, static_cast<int>(p), failed.down_generation);
  }
}

void TcpTransport::set_next_tick(base::Clock::time_point when) {
  next_tick_ns_.store(when.time_since_epoch().count(), std::memory_order_relaxed);
}

void TcpTransport::periodic_check() {
  const auto now = base::Clock::now();
  for (std::size_t r = 0; r < peers_.size(); ++r) {
    PeerLink& link = peers_[r];
    if (!link.served || link.failed || !link.reliable || closing_) continue;
    for (std::size_t p = 0; p < link.paths.size() && !link.failed; ++p)
      check_path(static_cast<int>(r), static_cast<int>(p), now);
    if (!link.failed && link.ack_due) send_ack(static_cast<int>(r));
  }
}

void TcpTransport::check_path(int peer, int index, base::Clock::time_point now) {
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  Path& path = link.paths[static_cast<std::size_t>(index)];
  if (path.state == Path::State::connecting) {
    // Only the connecting side times an attempt; the other waits for its hellos.
    if (link.connector && now >= path.connect_deadline)
      path_attempt_failed(
          peer, index, "no answer within " + std::to_string(path_connect_timeout.count()) + " s");
    return;
  }
  if (path.state == Path::State::failed) {
    if (link.connector && now >= path.next_probe) start_path(peer, index);
    return;
  }
  // Up: the kernel tells whether the peer acknowledges what we sent.
  std::uint32_t worst_ms = 0, rtt_us = 0;
  double capacity = 0;
  bool measured = false;  // some stream had enough to send to show the path's capacity
  for (std::size_t s = 0; s < path.streams.size(); ++s) {
    const auto& conn = path.streams[s];
    Connection::KernelState k;
    if (!conn || !conn->kernel_state(&k)) continue;
    const std::uint32_t unacked_ms = k.unacked_ms;
    if (k.rtt_us > 0 && (rtt_us == 0 || k.rtt_us < rtt_us)) rtt_us = k.rtt_us;
    capacity += static_cast<double>(k.delivery_rate);
    measured = measured || (!k.app_limited && k.delivery_rate > 0);
    auto& since = path.outstanding_since[s];
    if (unacked_ms == 0) {
      since = {};
      continue;
    }
    // Data sent after a quiet spell is not late before a timeout has passed since.
    if (since == base::Clock::time_point{}) since = now;
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - since);
    worst_ms = std::max(worst_ms, std::min(unacked_ms, static_cast<std::uint32_t>(waited.count())));
  }
  path.rtt_us = rtt_us;
  // What the path can carry: the kernel's delivery rate while it was busy; samples taken
  // while it idled only ever raise the estimate.
  if (measured || capacity > path.capacity)
    path.capacity = path.capacity == 0 ? capacity : 0.5 * path.capacity + 0.5 * capacity;
  const std::uint64_t bytes = path.bytes_sent();
  const double seconds = std::chrono::duration<double>(now - path.rate_at).count();
  if (seconds > 0) {
    const double sample = static_cast<double>(bytes - path.rate_bytes) / seconds;
    path.rate = path.rate == 0 ? sample : 0.7 * path.rate + 0.3 * sample;
    path.rate_bytes = bytes;
    path.rate_at = now;
  }
  const bool last = !other_path_up(link, index);
  const auto limit = last ? link_timeout_ : path_timeout_;
  if (worst_ms >= static_cast<std::uint32_t>(limit.count())) {
    const std::string cause =
        "no acknowledgement for " + std::to_string(worst_ms) + " ms (link down?)";
    if (!last) {
      path_failed(peer, index, cause, true);
      return;
    }
    path_failed(peer, index, cause, false);
    ErrorContext ctx = error_context(peer, "transfer");
    ctx.cause = "every path to rank " + std::to_string(peer) + " failed: " + describe_paths(link);
    fail_link(peer, Error(ErrorKind::link, std::move(ctx)));
    return;
  }
  // A quiet path gets a keepalive, so a dead one is noticed before it is needed.
  auto& stream0 = path.streams[0];
  if (!stream0) return;
  if (stream0->frames_queued() != path.keepalive_frames) {
    path.keepalive_frames = stream0->frames_queued();
    path.keepalive_at = now;
  } else if (now - path.keepalive_at >= path_timeout_ / 2) {
    WireHeader keepalive;
    keepalive.frame.type = frame_keepalive;
    stream0->queue_send(keepalive, nullptr, nullptr);
  }
}

std::string TcpTransport::describe_paths(const PeerLink& link) const {
  std::string text;
  for (std::size_t p = 0; p < link.paths.size(); ++p) {
    const Path& path = link.paths[p];
    if (!text.empty()) text += "; ";
    text += "path " + std::to_string(p) + " " + path.describe() + " ";
    switch (path.state) {
      case Path::State::up:
        text += "up";
        break;
      case Path::State::connecting:
        text += "connecting";
        break;
      case Path::State::failed:
        text +=
            "failed (" + (path.last_failure.empty() ? std::string("?") : path.last_failure) + ")";
        break;
    }
  }
  return text;
}

void TcpTransport::queue_ordered(int peer, Unacked& entry) {
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  Connection& conn = *link.paths[static_cast<std::size_t>(link.control)].streams[0];
  entry.path = link.control;
  const std::uint64_t seq = entry.seq;
  conn.queue_send(WireHeader{.seq = seq, .frame = entry.header}, entry.payload,
                  [this, peer, seq](const Error* error) {
                    // A failed write is sent again on another path; only success counts.
                    if (error == nullptr) on_ordered_written(peer, seq);
                  });
}

void TcpTransport::pump_ordered(int peer) {
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  if (link.control < 0 || link.failed) return;
  if (link.paths[static_cast<std::size_t>(link.control)].state != Path::State::up) return;
  // Waiting frames are always the newest ones (a suffix): from the back to the first that is
  // queued somewhere, then forward in order.
  std::size_t first = link.ordered_unacked.size();
  while (first > 0 && link.ordered_unacked[first - 1].path < 0) --first;
  for (std::size_t i = first; i < link.ordered_unacked.size(); ++i) {
    if (link.failed || link.control < 0) return;
    // Queued already by a pump_ordered nested in this one: a write that failed at once failed
    // its path, whose path_failed() queued the rest on another path. Queued twice, the frame
    // went out twice, and the copy no acknowledgement withdraws was written from its buffer
    // after its send completed.
    if (link.ordered_unacked[i].path >= 0) continue;
    queue_ordered(peer, link.ordered_unacked[i]);
  }
}

void TcpTransport::feed(int peer) {
  PeerLink& link = peers_[static_cast<std::size_t>(peer)];
  if (link.feeding || link.failed) return;
  link.feeding = true;
  while (!link.chunk_queue.empty() && !link.failed) {
    const std::uint64_t number = link.chunk_queue.front();
    if (link.chunk_unacked.empty() || number < (link.chunk_unacked.front().seq & ~chunk_seq_bit)) {
      link.chunk_queue.pop_front();  // acknowledged meanwhile (its first copy arrived)
      continue;
    }
    Unacked& entry = link.chunk_unacked[static_cast<std::size_t>(
        number - (link.chunk_unacked.front().seq & ~chunk_seq_bit))];
    // The stream expected to finish it first: what it has not delivered yet, plus the
    // chunk, over its path's capacity (unknown capacities count as the best known one),
    double known = 0;
    for (const auto& path : link.paths)
      if (path.state == Path::State::up) known = std::max(known, path.capacity);
    Connection* best = nullptr;
    int best_path = -1;
    double best_time = 0;
    for (std::size_t p = 0; p < link.paths.size(); ++p) {
      Path& path = link.paths[p];
      if (path.state != Path::State::up) continue;
      const double rate = path.capacity > 0 ? path.capacity : (known > 0 ? known : 1e9);
      for (std::size_t s = stream_count_ > 1 ? 1 : 0; s < path.streams.size(); ++s) {
        Connection* conn = path.streams[s].get();
        if (conn == nullptr || conn->queued_bytes() >= feed_limit) continue;
        // ... plus half a round trip for its last byte to arrive.
        const double time =
            static_cast<double>(conn->unsent_bytes() + entry.header.payload_bytes) / rate +
            path.rtt_us * 0.5e-6;
        if (best == nullptr || time < best_time) {
          best = conn;
          best_path = static_cast<int>(p);
          best_time = time;
        }
      }
    }
    if (best == nullptr) break;  // every stream is busy: the next one that drains pulls more
    link.chunk_queue.pop_front();
    entry.path = best_path;
    best->queue_send(WireHeader{.seq = entry.seq, .frame = entry.header}, entry.payload, nullptr);
  }
  link.feeding = false;
}

void TcpTransport::on_stream_room(Connection& conn) {
  if (conn.peer() < 0) return;
  PeerLink& link = peers_[static_cast<std::size_t>(conn.peer())];
  if (link.reliable && !link.chunk_queue.empty()) feed(conn.peer());
}

}  // namespace anview::transport::tcp
