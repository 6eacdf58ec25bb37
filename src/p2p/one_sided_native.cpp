// One-sided access through a transport's native path (transport.hpp, RemoteAccess: UCX's RMA
// on memory registered with UCX), for the peers the transport offers it for.
//
// Keys: a RemoteKey names a region, not the transport's key for it. An initiator asks the
// owner for that once per region (key_request); the owner registers the region with the
// transport on the first request and answers with the packed key (key_reply), remembering
// who holds it. Operations that come meanwhile wait for the reply. A region the transport
// cannot register is answered no_native_key, and its operations go as frames.
//
// Deregistration: a native put with a key the owner has released would write freed memory
// (or, on RDMA hardware, fail the whole endpoint). So the owner first stops answering for the
// region, then sends every holder key_withdraw; a holder drops the key, flushes what it issued
// to the owner, and answers key_withdrawn; only then is the registration released. A later
// operation with the key asks again and is refused as stale, like every other path.
#include <cstring>

#include "base/log.hpp"
#include "p2p/messenger.hpp"
#include "p2p/request_pool.hpp"

namespace anview::p2p {
namespace {

transport::FrameHeader key_frame(FrameType type, std::uint64_t token, RmaReject why) {
  transport::FrameHeader h;
  h.type = static_cast<std::uint8_t>(type);
  h.tag = token;
  h.flags = static_cast<std::uint8_t>(why);
  return h;
}

std::string mismatch_cause(int owner) {
  return "the key does not match the region rank " + std::to_string(owner) +
         " registered under its token";
}

}  // namespace

void Messenger::native_rma(const RequestPtr& op, const RemoteKey& key, std::uint64_t offset) {
  const int peer = key.rank;
  PeerState& ps = peers_[static_cast<std::size_t>(peer)];
  op->id = next_id_++;
  op->phase = RequestImpl::Phase::transferring;
  ps.rma.emplace(op->id, op);
  auto [it, asked_now] = ps.native_keys.try_emplace(key.token);
  PeerState::NativeKey& nk = it->second;
  if (nk.ready) {
    // The key's view of the region must be the one the owner registered under the token.
    if (nk.access != nullptr && (nk.address != key.address || nk.bytes != key.bytes)) {
      finish_rma(peer, op->id, rma_error(*op, ErrorKind::usage, mismatch_cause(peer)));
      return;
    }
    post_native(op, key, offset, nk, false);
    return;
  }
  nk.waiting.push_back({op, key, offset});
  // A failed link fails the waiting operations (they are in ps.rma) through on_peer_failed.
  if (asked_now) {
    send_frame(peer, key_frame(FrameType::key_request, key.token, RmaReject::none), nullptr,
               transport::Ordering::ordered, nullptr);
  }
}

void Messenger::post_native(const RequestPtr& op, const RemoteKey& key, std::uint64_t offset,
                            const PeerState::NativeKey& nk, bool then_flush) {
  const int peer = key.rank;
  PeerState& ps = peers_[static_cast<std::size_t>(peer)];
  const std::uint64_t id = op->id;
  if (nk.access == nullptr) {
    emulate_rma(op, key, offset);
    return;
  }
  ++ps.stats.native_rma;
  ps.native_unflushed = true;
  const char* name = rma_name(op->kind);
  // then_flush: a flush was called while this operation waited for its key; it covers the
  // operation, which therefore completes only once it is complete at the target (a flush of
  // its own, below), with its own failure if it had one.
  auto failure = then_flush ? std::make_shared<std::optional<Error>>() : nullptr;
  transport::SendDone done = [this, peer, id, name, failure](const Error* e) {
    std::optional<Error> error;
    if (e) error = e->for_operation(name, std::nullopt);
    if (!failure) {
      finish_rma(peer, id, std::move(error));
    } else if (error && !*failure) {
      *failure = std::move(error);
    }
  };
  const std::uint64_t remote = nk.address + offset;
  if (op->kind == RequestImpl::Kind::put) {
    nk.access->put(peer, key.token, op->send_data, op->send_bytes, remote, std::move(done));
  } else {
    nk.access->get(peer, key.token, op->recv_data, op->capacity, remote, std::move(done));
  }
  if (!failure) return;
  nk.access->flush(peer, [this, peer, id, name, failure](const Error* e) {
    if (e && !*failure) *failure = e->for_operation(name, std::nullopt);
    finish_rma(peer, id, *failure);
  });
}

transport::Landing Messenger::on_key_frame(int peer, const transport::FrameHeader& h) {
  PeerState& ps = peers_[static_cast<std::size_t>(peer)];
  const auto type = static_cast<FrameType>(h.type);
  if (type == FrameType::key_reply && h.payload_bytes > 0) {
    if (h.flags != 0) {
      protocol_error(peer, "a refused key reply with a payload");
      return {};
    }
    if (h.payload_bytes <= sizeof(KeyReply) || h.payload_bytes > max_key_reply_bytes) {
      protocol_error(peer, "key reply of " + std::to_string(h.payload_bytes) + " bytes");
      return {};
    }
    ps.incoming_key.resize(h.payload_bytes);
    return {.data = ps.incoming_key.data(), .defer = false};
  }
  if (h.payload_bytes != 0) {
    protocol_error(peer, "key frame of type " + std::to_string(h.type) + " with a payload");
    return {};
  }
  switch (type) {
    case FrameType::key_request:
      answer_key_request(peer, h.tag);
      break;
    case FrameType::key_reply: {  // a refusal
      const auto why = static_cast<RmaReject>(h.flags);
      if (why != RmaReject::unknown_region && why != RmaReject::no_native_key) {
        protocol_error(peer, "key reply refused for reason " + std::to_string(h.flags));
        break;
      }
      refuse_waiting(peer, h.tag, why);
      break;
    }
    case FrameType::key_withdraw:
      drop_key(peer, h.tag);
      break;
    case FrameType::key_withdrawn:
      key_released(h.tag, peer);
      break;
    default:
      break;
  }
  return {};
}

void Messenger::on_key_frame_done(int peer, const transport::FrameHeader& h) {
  if (static_cast<FrameType>(h.type) == FrameType::key_reply && h.payload_bytes > 0)
    take_key_reply(peer, h);
}

void Messenger::answer_key_request(int peer, std::uint64_t token) {
  PeerState& ps = peers_[static_cast<std::size_t>(peer)];
  const RegionRecord* region = regions_.find(token);
  if (region == nullptr) {
    send_frame(peer, key_frame(FrameType::key_reply, token, RmaReject::unknown_region), nullptr,
               transport::Ordering::ordered, nullptr);
    return;
  }
  transport::RemoteAccess* access = ps.transport->remote_access(peer);
  auto it = exposed_.find(token);
  if (access != nullptr && it == exposed_.end()) {
    std::string why;
    auto packed =
        access->expose(token, reinterpret_cast<void*>(region->address), region->bytes, &why);
    if (packed) {
      it = exposed_.emplace(token, Exposure{.access = access, .packed = std::move(*packed)}).first;
    } else {
      base::log("p2p", base::LogLevel::info, "rank ", config_.rank, ": a region of ", region->bytes,
                " bytes is not reachable natively by rank ", peer, " (", why,
                "): its puts and gets go as frames");
    }
  }
  if (access == nullptr || it == exposed_.end() || it->second.access != access) {
    send_frame(peer, key_frame(FrameType::key_reply, token, RmaReject::no_native_key), nullptr,
               transport::Ordering::ordered, nullptr);
    return;
  }
  it->second.holders.insert(peer);
  auto payload = std::make_shared<std::string>(sizeof(KeyReply) + it->second.packed.size(), '\0');
  const KeyReply head{.address = region->address, .bytes = region->bytes};
  std::memcpy(payload->data(), &head, sizeof head);
  std::memcpy(payload->data() + sizeof head, it->second.packed.data(), it->second.packed.size());
  transport::FrameHeader h = key_frame(FrameType::key_reply, token, RmaReject::none);
  h.payload_bytes = static_cast<std::uint32_t>(payload->size());
  send_frame(peer, h, payload->data(), transport::Ordering::ordered,
             [payload](const Error*) {});  // the payload lives until it is handed over
}

void Messenger::take_key_reply(int peer, const transport::FrameHeader& h) {
  PeerState& ps = peers_[static_cast<std::size_t>(peer)];
  auto it = ps.native_keys.find(h.tag);
  if (it == ps.native_keys.end() || it->second.ready) return;  // not asked, or failed here
  if (ps.incoming_key.size() != h.payload_bytes) return;       // refused at on_frame
  PeerState::NativeKey& nk = it->second;
  KeyReply head;
  std::memcpy(&head, ps.incoming_key.data(), sizeof head);
  const std::string packed(ps.incoming_key.data() + sizeof head,
                           ps.incoming_key.size() - sizeof head);
  ps.incoming_key.clear();
  nk.ready = true;
  nk.address = head.address;
  nk.bytes = head.bytes;
  nk.access = ps.transport->remote_access(peer);
  std::string why;
  if (nk.access == nullptr || !nk.access->accept_key(peer, h.tag, packed, &why)) {
    if (nk.access != nullptr) {
      base::log("p2p", base::LogLevel::info, "rank ", config_.rank, ": the native key of rank ",
                peer, "'s region is not usable here (", why, "): puts and gets go as frames");
    }
    nk.access = nullptr;
  }
  auto waiting = std::move(nk.waiting);
  nk.waiting.clear();
  // A copy: a completion inside the loop may fail the link, which clears native_keys.
  const PeerState::NativeKey native = nk;
  const bool covered = !ps.flushes.empty();
  for (auto& w : waiting) {
    if (w.op->phase == RequestImpl::Phase::complete) continue;
    if (native.address != w.key.address || native.bytes != w.key.bytes) {
      finish_rma(peer, w.op->id, rma_error(*w.op, ErrorKind::usage, mismatch_cause(peer)));
      continue;
    }
    post_native(w.op, w.key, w.offset, native, covered);
  }
}

void Messenger::refuse_waiting(int peer, std::uint64_t token, RmaReject why) {
  PeerState& ps = peers_[static_cast<std::size_t>(peer)];
  auto it = ps.native_keys.find(token);
  if (it == ps.native_keys.end() || it->second.ready) return;
  auto waiting = std::move(it->second.waiting);
  if (why == RmaReject::unknown_region) {
    // Not remembered: a later operation with the token asks again (and is refused again).
    ps.native_keys.erase(it);
    for (auto& w : waiting) {
      finish_rma(peer, w.op->id, rma_error(*w.op, ErrorKind::usage, stale_cause(peer)));
    }
    return;
  }
  it->second.ready = true;  // no_native_key (access stays null): frames from now on
  const PeerState::NativeKey native = it->second;
  for (auto& w : waiting) post_native(w.op, w.key, w.offset, native, false);
}

void Messenger::drop_key(int peer, std::uint64_t token) {
  PeerState& ps = peers_[static_cast<std::size_t>(peer)];
  transport::RemoteAccess* access = nullptr;
  if (auto it = ps.native_keys.find(token); it != ps.native_keys.end()) {
    if (!it->second.ready) {
      protocol_error(peer, "a key withdrawn before it was handed out");
      return;
    }
    access = it->second.access;
    ps.native_keys.erase(it);
  }
  auto answer = [this, peer, token] {
    send_frame(peer, key_frame(FrameType::key_withdrawn, token, RmaReject::none), nullptr,
               transport::Ordering::ordered, nullptr);
  };
  if (access == nullptr) {
    answer();
    return;
  }
  // What was issued with the key lands before the owner hears back.
  access->flush(peer, [access, peer, token, answer](const Error*) {
    access->forget_key(peer, token);
    answer();
  });
}

void Messenger::key_released(std::uint64_t token, int peer) {
  auto it = withdrawals_.find(token);
  if (it == withdrawals_.end()) return;  // late, after the owner gave up waiting
  it->second.waiting.erase(peer);
  if (it->second.waiting.empty()) complete(it->second.request, std::nullopt);
}

void Messenger::flush_native(int peer) {
  PeerState& ps = peers_[static_cast<std::size_t>(peer)];
  if (!ps.native_unflushed || ps.failure) return;
  ps.native_unflushed = false;
  transport::RemoteAccess* access = ps.transport->remote_access(peer);
  if (access == nullptr) return;  // the link is failing: the operations fail with it
  auto op = new_request(shared_from_this(), RequestImpl::Kind::flush, peer, Tag{0});
  op->id = next_id_++;
  op->phase = RequestImpl::Phase::transferring;
  ps.rma.emplace(op->id, op);
  const std::uint64_t id = op->id;
  access->flush(peer, [this, peer, id](const Error* e) {
    finish_rma(peer, id,
               e ? std::optional<Error>(e->for_operation("flush", std::nullopt)) : std::nullopt);
  });
}

void Messenger::withdraw_native(std::uint64_t token) {
  RequestPtr waiting;
  std::set<int> holders;
  {
    Lock lock(mu_);
    auto it = exposed_.find(token);
    if (it == exposed_.end()) return;
    for (int p : it->second.holders)
      if (!peers_[static_cast<std::size_t>(p)].failure) holders.insert(p);
    if (!closed_ && !holders.empty()) {
      waiting = new_request(shared_from_this(), RequestImpl::Kind::flush, -1, Tag{0});
      withdrawals_[token] = Withdrawal{.request = waiting, .waiting = holders};
      for (int p : holders) {
        send_frame(p, key_frame(FrameType::key_withdraw, token, RmaReject::none), nullptr,
                   transport::Ordering::ordered, [this, token, p](const Error* e) {
                     if (e) key_released(token, p);  // the link failed: it cannot write either
                   });
      }
    }
  }
  if (waiting) {
    try {
      wait(*waiting, config_.timeout);
    } catch (const Error&) {
      std::string ranks;
      {
        Lock lock(mu_);
        for (int p : withdrawals_[token].waiting)
          ranks += (ranks.empty() ? "" : ", ") + std::to_string(p);
      }
      base::log("p2p", base::LogLevel::warn, "rank ", config_.rank, ": deregister_memory: rank(s) ",
                ranks, " did not confirm within ", config_.timeout.count(),
                " ms that they dropped the region's key; releasing the registration anyway");
    }
  }
  Lock lock(mu_);
  withdrawals_.erase(token);
  auto it = exposed_.find(token);
  if (it == exposed_.end()) return;
  it->second.access->conceal(token);
  exposed_.erase(it);
}

}  // namespace anview::p2p
