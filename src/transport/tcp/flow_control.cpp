// Receiver-driven flow control of the TCP transport's data streams (ANVIEW_TCP_CREDIT): a
// receiver grants each data stream credit as it reads, sharing its budget among the peers
// that are sending at the moment, so many senders into one rank (incast) keep a bounded
// amount on its link instead of filling every queue on the way. Stream 0 (ordered frames)
// never waits for credit.
#include <algorithm>
#include <functional>

#include "transport/tcp/multipath.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace anview::transport::tcp {

Connection* TcpTransport::control_frame_stream(PeerLink& link) {
  if (link.failed || closing_) return nullptr;
  // A data stream when there is one: the peer never stops reading those (it stops reading
  // stream 0 while its unexpected-message budget is full), so acknowledgements and credit
  // always get through.
  auto usable = [&](int index) -> Connection* {
    if (index < 0) return nullptr;
    Path& path = link.paths[static_cast<std::size_t>(index)];
    if (path.state != Path::State::up) return nullptr;
    auto& conn = path.streams[stream_count_ > 1 ? 1 : 0];
    return conn && conn->state() == Connection::State::established ? conn.get() : nullptr;
  };
  if (Connection* conn = usable(link.control)) return conn;
  for (std::size_t p = 0; p < link.paths.size(); ++p)
    if (Connection* conn = usable(static_cast<int>(p))) return conn;
  return nullptr;
}

void TcpTransport::start_credit(PeerLink& link, Connection& conn) {
  if (stream_count_ < 2 || conn.stream() < 1) return;
  if (link.peer_grants) conn.set_credit(initial_credit);
  if (grants_credit(link)) conn.set_granted(initial_credit);
}

int TcpTransport::active_senders(base::Clock::time_point now) const {
  int active = 0;
  for (const auto& link : peers_)
    if (link.served && !link.failed && now - link.data_at < active_sender_window) ++active;
  return std::max(active, 1);
}

void TcpTransport::on_read_idle(Connection& conn) {
  if (conn.peer() < 0) return;
  PeerLink& link = peers_[static_cast<std::size_t>(conn.peer())];
  if (grants_credit(link) && stream_count_ > 1 && conn.stream() >= 1 && !link.failed) {
    const auto now = base::Clock::now();
    link.data_at = now;
    // No window exceeds max(budget, min_credit): while more than half of that is still
    // outstanding no grant can be due, and the share need not be worked out (a loop over
    // every peer) on each read.
    const std::uint64_t outstanding =
        conn.granted() - std::min(conn.granted(), conn.credited_received());
    if (outstanding >= std::max(credit_bytes_, min_credit) / 2) {
      if (link.ack_due) send_ack(conn.peer());
      return;
    }
    grant_if_due(link, conn, now);
  }
  if (link.ack_due) send_ack(conn.peer());
}

void TcpTransport::grant_if_due(PeerLink& link, Connection& conn, base::Clock::time_point now) {
  std::uint64_t streams = 0;
  for (const auto& path : link.paths)
    if (path.state == Path::State::up) streams += static_cast<std::uint64_t>(stream_count_ - 1);
  const std::uint64_t share = credit_bytes_ / (static_cast<std::uint64_t>(active_senders(now)) *
                                               std::max<std::uint64_t>(streams, 1));
  const std::uint64_t window = std::max(share, min_credit);
  // Grant again once half of what is outstanding has been read.
  if (conn.granted() < conn.credited_received() + window / 2)
    grant_credit(conn, conn.credited_received() + window);
}

void TcpTransport::each_granted_stream(PeerLink& link, bool up_paths_only,
                                       const std::function<void(Connection&)>& fn) {
  if (!grants_credit(link) || stream_count_ < 2 || link.failed) return;
  for (auto& path : link.paths) {
    if (up_paths_only && path.state != Path::State::up) continue;
    for (std::size_t s = 1; s < path.streams.size(); ++s)
      if (path.streams[s] && path.streams[s]->state() == Connection::State::established)
        fn(*path.streams[s]);
  }
}

void TcpTransport::grants_after_path_up(PeerLink& link) {
  const auto now = base::Clock::now();
  each_granted_stream(link, false, [&](Connection& conn) { grant_if_due(link, conn, now); });
}

void TcpTransport::grants_after_path_failed(PeerLink& link) {
  // Repeats raise nothing: a sender takes a grant only above the limit it has.
  each_granted_stream(link, true, [&](Connection& conn) { grant_credit(conn, conn.granted()); });
}

void TcpTransport::grant_credit(Connection& conn, std::uint64_t limit) {
  PeerLink& link = peers_[static_cast<std::size_t>(conn.peer())];
  // Granted only once it can be sent: no path up (a data stream may be admitted before the
  // rest of its path) leaves it due, for the next read or the next path up.
  Connection* carrier = control_frame_stream(link);
  if (carrier == nullptr) return;
  conn.set_granted(limit);
  WireHeader credit;
  credit.frame.type = frame_credit;
  credit.frame.tag = static_cast<std::uint64_t>(conn.path());
  credit.frame.id =
      std::uint64_t{conn.generation()} << 16 | static_cast<std::uint64_t>(conn.stream());
  credit.frame.arg = conn.granted();
  carrier->queue_send(credit, nullptr, nullptr);
}

}  // namespace anview::transport::tcp
