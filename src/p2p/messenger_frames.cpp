// The receiving half of the p2p protocol: what the Messenger does with each incoming frame
// (transport::FrameSink). Every field read from the wire is checked before use; a frame that
// breaks the protocol closes the link to its sender with a protocol Error.
#include <algorithm>
#include <cstring>
#include <iterator>
#include <utility>
#include <vector>

#include "base/log.hpp"
#include "p2p/messenger.hpp"
#include "p2p/protocol.hpp"

namespace anview::p2p {
namespace {

// Adds [begin, end) to `ranges` (sorted, disjoint, adjacent ones merged); false, adding nothing,
// where it overlaps a range already there.
bool cover(std::vector<std::pair<std::size_t, std::size_t>>& ranges, std::size_t begin,
           std::size_t end) {
  if (begin == end) return true;
  // The first range that ends after `begin` (ends increase along the vector).
  auto next = std::lower_bound(ranges.begin(), ranges.end(), begin,
                               [](const auto& range, std::size_t b) { return range.second <= b; });
  if (next != ranges.end() && next->first < end) return false;
  const bool joins_previous = next != ranges.begin() && std::prev(next)->second == begin;
  const bool joins_next = next != ranges.end() && next->first == end;
  if (joins_previous && joins_next) {
    std::prev(next)->second = next->second;
    ranges.erase(next);
  } else if (joins_previous) {
    std::prev(next)->second = end;
  } else if (joins_next) {
    next->first = begin;
  } else {
    ranges.insert(next, {begin, end});
  }
  return true;
}

// What an unexpected message costs the per-peer budget besides its payload: its queue entry
// and allocation. So a stream of empty or one-byte messages nobody receives fills the budget
// too (charged their payload alone, a million empty ones cost nothing). A rendezvous
// announcement costs this alone.
constexpr std::size_t unexpected_entry_bytes = 64;

std::string truncation_cause(std::size_t bytes, int source, std::size_t capacity) {
  return "the message of " + std::to_string(bytes) + " bytes from rank " + std::to_string(source) +
         " does not fit the receive buffer of " + std::to_string(capacity) + " bytes";
}

}  // namespace

void Messenger::protocol_error(int peer, const std::string& cause) {
  const Error error(ErrorKind::protocol,
                    {.rank = config_.rank, .peer = peer, .operation = "recv", .cause = cause});
  peers_[static_cast<std::size_t>(peer)].transport->fail_peer(peer, error);
}

transport::Landing Messenger::on_frame(int peer, const transport::FrameHeader& h, bool may_defer) {
  if (closed_) return {};
  PeerState& ps = peers_[static_cast<std::size_t>(peer)];
  auto find_posted = [&]() -> RequestPtr { return posted_.find(peer, h.tag, true); };
  auto over_budget = [&](std::size_t cost) {
    return may_defer && ps.unexpected_bytes > 0 && ps.unexpected_bytes + cost > unexpected_limit_;
  };

  switch (static_cast<FrameType>(h.type)) {
    case FrameType::eager: {
      // Within budget a match is taken at once; beyond it, peek first: a deferred frame must
      // leave no trace.
      const bool budget_ok = !over_budget(h.payload_bytes + unexpected_entry_bytes);
      RequestPtr recv = budget_ok ? find_posted() : posted_.find(peer, h.tag, false);
      if (!recv && !budget_ok) {
        ps.deferred = true;
        return {.data = nullptr, .defer = true};
      }
      if (recv && !budget_ok) recv = find_posted();
      if (recv) {
        recv->status = Status{peer, Tag{h.tag}, h.payload_bytes};
        recv->expected = h.payload_bytes;
        if (h.payload_bytes > recv->capacity) {
          complete(recv, request_error(*recv, ErrorKind::usage,
                                       truncation_cause(h.payload_bytes, peer, recv->capacity)));
          return {};  // the transport consumes and drops the payload
        }
        recv->phase = RequestImpl::Phase::matched;
        char* landing = recv->recv_data;
        ps.eager_target = std::move(recv);
        return {.data = landing, .defer = false};
      }
      Unexpected u{.source = peer,
                   .tag = h.tag,
                   .bytes = h.payload_bytes,
                   .rendezvous = false,
                   .sender_id = 0,
                   .data = std::make_unique_for_overwrite<char[]>(h.payload_bytes),
                   .complete = false,
                   .waiting = nullptr};
      char* landing = u.data.get();
      ps.eager_unexpected = unexpected_.push(std::move(u));
      ps.unexpected_bytes += h.payload_bytes + unexpected_entry_bytes;
      ps.eager_to_unexpected = true;
      return {.data = landing, .defer = false};
    }
    case FrameType::rts: {
      // (An empty message always goes eagerly: a receive matched to an empty announcement
      // would wait for data that never comes.)
      if (h.payload_bytes != 0 || h.arg == 0 || h.arg > max_message_bytes || h.id == 0) {
        protocol_error(peer, "bad ready-to-send frame (size " + std::to_string(h.arg) +
                                 ", payload " + std::to_string(h.payload_bytes) + ")");
        return {};
      }
      if (RequestPtr recv = find_posted()) {
        start_rendezvous_receive(recv, peer, h.tag, h.arg, h.id);
        return {};
      }
      if (over_budget(unexpected_entry_bytes)) {
        ps.deferred = true;
        return {.data = nullptr, .defer = true};
      }
      unexpected_.push(Unexpected{.source = peer,
                                  .tag = h.tag,
                                  .bytes = h.arg,
                                  .rendezvous = true,
                                  .sender_id = h.id,
                                  .data = nullptr,
                                  .complete = true,
                                  .waiting = nullptr});
      ps.unexpected_bytes += unexpected_entry_bytes;
      return {};
    }
    case FrameType::cts: {
      auto it = sends_.find(h.id);
      if (h.payload_bytes != 0 || it == sends_.end() || it->second->peer != peer) {
        protocol_error(peer, "clear-to-send for unknown send request " + std::to_string(h.id));
        return {};
      }
      RequestPtr send = std::move(it->second);
      sends_.erase(it);
      if (h.flags & cts_reject) {
        complete(send,
                 request_error(*send, ErrorKind::usage,
                               "rank " + std::to_string(peer) + " posted a receive buffer of " +
                                   std::to_string(h.arg) + " bytes for this " +
                                   std::to_string(send->send_bytes) + "-byte message"));
      } else {
        send_data(send, h.arg);
      }
      return {};
    }
    case FrameType::data: {
      auto it = recvs_.find(h.id);
      if (it == recvs_.end() || it->second->status.source != peer || h.arg > it->second->expected ||
          h.payload_bytes > it->second->expected - h.arg) {
        protocol_error(peer, "data frame for unknown receive " + std::to_string(h.id) +
                                 " or outside its message (offset " + std::to_string(h.arg) + ", " +
                                 std::to_string(h.payload_bytes) + " bytes)");
        return {};
      }
      // A sender's chunks partition the message. One over a part already covered (a chunk sent
      // twice) would count its bytes twice: the receive would complete with a part never
      // written, or never complete.
      RequestImpl& recv = *it->second;
      if (!cover(recv.covered, h.arg, h.arg + h.payload_bytes)) {
        protocol_error(peer, "data frame for receive " + std::to_string(h.id) + " covers bytes " +
                                 std::to_string(h.arg) + " to " +
                                 std::to_string(h.arg + h.payload_bytes) +
                                 " of the message again (a chunk came twice)");
        return {};
      }
      return {.data = recv.recv_data + h.arg, .defer = false};
    }
    case FrameType::put:
    case FrameType::put_ack:
    case FrameType::get:
    case FrameType::get_data:
      return on_rma_frame(peer, h);
    case FrameType::key_request:
    case FrameType::key_reply:
    case FrameType::key_withdraw:
    case FrameType::key_withdrawn:
      return on_key_frame(peer, h);
  }
  protocol_error(peer, "unknown frame type " + std::to_string(h.type));
  return {};
}

void Messenger::on_frame_done(int peer, const transport::FrameHeader& h, void*) {
  if (closed_) return;
  PeerState& ps = peers_[static_cast<std::size_t>(peer)];
  switch (static_cast<FrameType>(h.type)) {
    case FrameType::eager:
      if (ps.eager_to_unexpected) {
        ps.eager_to_unexpected = false;
        auto it = ps.eager_unexpected;
        it->complete = true;
        if (RequestPtr waiting = std::move(it->waiting)) match_unexpected(waiting, it);
      } else if (ps.eager_target) {
        complete(std::move(ps.eager_target), std::nullopt);
      }
      return;
    case FrameType::data: {
      auto it = recvs_.find(h.id);
      if (it == recvs_.end()) return;
      RequestImpl& recv = *it->second;
      recv.received += h.payload_bytes;
      if (recv.received == recv.expected) {
        RequestPtr done = std::move(it->second);
        recvs_.erase(it);
        complete(std::move(done), std::nullopt);
      }
      return;
    }
    case FrameType::put:
    case FrameType::get:
    case FrameType::get_data:
      on_rma_frame_done(peer, h);
      return;
    case FrameType::key_reply:
      on_key_frame_done(peer, h);
      return;
    default:
      return;
  }
}

void Messenger::match_unexpected(const RequestPtr& recv, UnexpectedQueue::Iterator it) {
  const int source = it->source;
  if (it->rendezvous) {
    // Out of the queue before the clear-to-send goes: a transport may fail the link inside
    // that send (a TCP write to a peer that is gone), and on_peer_failed() drops the peer's
    // announced messages, this one too if it were still there.
    const std::uint64_t tag = it->tag;
    const std::size_t bytes = it->bytes;
    const std::uint64_t sender_id = it->sender_id;
    unexpected_.erase(it);
    start_rendezvous_receive(recv, source, tag, bytes, sender_id);
    release_unexpected(source, unexpected_entry_bytes);
    return;
  }
  if (!it->complete) {  // its payload is still arriving; finish when it is in
    recv->phase = RequestImpl::Phase::matched;
    recv->status = Status{source, Tag{it->tag}, it->bytes};
    recv->expected = it->bytes;
    it->waiting = recv;
    return;
  }
  const std::size_t bytes = it->bytes;
  recv->status = Status{source, Tag{it->tag}, bytes};
  recv->expected = bytes;
  if (bytes > recv->capacity) {
    complete(recv, request_error(*recv, ErrorKind::usage,
                                 truncation_cause(bytes, source, recv->capacity)));
  } else {
    if (bytes > 0) std::memcpy(recv->recv_data, it->data.get(), bytes);
    recv->received = bytes;
    complete(recv, std::nullopt);
  }
  unexpected_.erase(it);
  release_unexpected(source, bytes + unexpected_entry_bytes);
}

void Messenger::release_unexpected(int peer, std::size_t bytes) {
  PeerState& ps = peers_[static_cast<std::size_t>(peer)];
  ps.unexpected_bytes -= std::min(bytes, ps.unexpected_bytes);
  if (ps.unexpected_bytes < unexpected_limit_) resume_reading(peer);
}

void Messenger::resume_reading(int peer) {
  PeerState& ps = peers_[static_cast<std::size_t>(peer)];
  if (!ps.deferred) return;
  ps.deferred = false;
  if (ps.transport) ps.transport->resume(peer);
}

void Messenger::start_rendezvous_receive(const RequestPtr& recv, int source, std::uint64_t tag,
                                         std::size_t bytes, std::uint64_t sender_id) {
  recv->status = Status{source, Tag{tag}, bytes};
  recv->expected = bytes;
  transport::FrameHeader cts;
  cts.type = static_cast<std::uint8_t>(FrameType::cts);
  cts.id = sender_id;
  if (bytes > recv->capacity) {
    cts.flags = cts_reject;
    cts.arg = recv->capacity;
    send_frame(source, cts, nullptr, transport::Ordering::ordered, nullptr);
    complete(recv, request_error(*recv, ErrorKind::usage,
                                 truncation_cause(bytes, source, recv->capacity)));
    return;
  }
  recv->id = next_id_++;
  recv->phase = RequestImpl::Phase::matched;
  recvs_.emplace(recv->id, recv);
  cts.arg = recv->id;
  send_frame(source, cts, nullptr, transport::Ordering::ordered, nullptr);
}

void Messenger::send_data(const RequestPtr& send, std::uint64_t receiver_id) {
  send->phase = RequestImpl::Phase::transferring;
  const std::size_t bytes = send->send_bytes;
  const std::size_t chunk = chunk_bytes(send->peer);
  send->chunks_pending = (bytes + chunk - 1) / chunk;
  for (std::size_t offset = 0; offset < bytes; offset += chunk) {
    transport::FrameHeader h;
    h.type = static_cast<std::uint8_t>(FrameType::data);
    h.payload_bytes = static_cast<std::uint32_t>(std::min(chunk, bytes - offset));
    h.id = receiver_id;
    h.arg = offset;
    send_frame(send->peer, h, send->send_data + offset, transport::Ordering::any_stream,
               [this, send](const Error* e) {
                 if (send->phase == RequestImpl::Phase::complete) return;
                 if (e) {
                   complete(send, e->for_operation("send", to_underlying(send->tag)));
                 } else if (--send->chunks_pending == 0) {
                   complete(send, std::nullopt);
                 }
               });
    if (send->phase == RequestImpl::Phase::complete) return;
  }
}

void Messenger::on_peer_failed(int peer, const Error& error, bool left) {
  PeerState& ps = peers_[static_cast<std::size_t>(peer)];
  if (ps.failure) return;
  ps.failure = error;
  ps.left = left;
  auto fail = [&](const RequestPtr& r) {
    complete(r, error.for_operation(r->kind == RequestImpl::Kind::send ? "send" : "recv",
                                    to_underlying(r->tag)));
  };
  if (ps.eager_target) fail(ps.eager_target);
  ps.eager_target.reset();
  if (ps.eager_to_unexpected) {
    ps.eager_to_unexpected = false;
    if (ps.eager_unexpected->waiting) fail(ps.eager_unexpected->waiting);
    unexpected_.erase(ps.eager_unexpected);
  }
  // Announced rendezvous messages from the peer can never arrive now; complete eager ones can
  // still be received.
  auto& from_peer = unexpected_.from(peer);
  for (auto it = from_peer.begin(); it != from_peer.end();) {
    it = it->rendezvous ? from_peer.erase(it) : std::next(it);
  }
  for (auto& r : posted_.take_from(peer, all_remote_peers_failed())) fail(r);
  for (auto it = sends_.begin(); it != sends_.end();) {
    if (it->second->peer == peer) {
      fail(it->second);
      it = sends_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = recvs_.begin(); it != recvs_.end();) {
    if (it->second->status.source == peer) {
      fail(it->second);
      it = recvs_.erase(it);
    } else {
      ++it;
    }
  }
  fail_rma(ps, error);
  // A dead or unreachable holder of a native key cannot write any more: stop waiting for it.
  for (auto& [token, w] : withdrawals_) {
    if (w.waiting.erase(peer) > 0 && w.waiting.empty()) complete(w.request, std::nullopt);
  }
}

}  // namespace anview::p2p
