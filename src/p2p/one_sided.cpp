// One-sided access (docs/one-sided.md): registered regions, put, get and flush.
//
// Three paths, chosen per operation:
// - to this rank itself: a copy, after checking the region table;
// - direct, where the peer's transport offers access to its memory (shm with cross-memory
//   attach): the initiator reads the region's record in the owner's memory, checks that it
//   still names the key's region, then copies; the owner does nothing;
// - emulated with frames everywhere else (TCP, shm without cross-memory attach): the owner's
//   progress lands a put's payload straight in the region and acknowledges it, and answers a
//   get with data frames read straight from the region. So that this needs no code on the
//   owner's side, registering memory starts a background thread that drives progress while
//   no thread of the rank waits.
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <limits>
#include <system_error>

#include "base/log.hpp"
#include "p2p/messenger.hpp"
#include "p2p/request_pool.hpp"

namespace anview::p2p {
namespace {

// How long the background thread sleeps in the kernel when idle, and how long it stays out of
// the way after a thread of the rank asked for the driver role.
constexpr int background_sleep_ms = 50;
constexpr auto background_back_off = std::chrono::milliseconds(2);

// allocate_memory's segments: a header page, then the region. The header holds the token
// (0 once deregistered), the region's address in its owner, its size and its communicator's
// scope: a peer that maps the segment checks its key and its own scope against them before it
// copies (the key may have been altered, or come from another communicator; the header is the
// owner's word). The other fields are written before the token is published.
constexpr std::size_t segment_header_bytes = 4096;
constexpr std::size_t max_mappings = 4096;

std::atomic_ref<std::uint64_t> header_token(char* segment) {
  return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(segment));
}
std::uint64_t& header_address(char* segment) {
  return reinterpret_cast<std::uint64_t*>(segment)[1];
}
std::uint64_t& header_bytes(char* segment) {
  return reinterpret_cast<std::uint64_t*>(segment)[2];
}
std::uint64_t& header_scope(char* segment) {
  return reinterpret_cast<std::uint64_t*>(segment)[3];
}
// The segment still holds the region `key` names, as the key describes it, registered in the
// communicator of `scope`.
bool segment_matches(char* segment, const RemoteKey& key, std::uint64_t scope) {
  return header_token(segment).load(std::memory_order_acquire) == key.token &&
         header_address(segment) == key.address && header_bytes(segment) == key.bytes &&
         header_scope(segment) == scope;
}

// A large copy in pieces: one memcpy of many megabytes switches to non-temporal stores,
// which bypass the cache and run at memory speed even where source and target fit in it.
// This is how UCX copies into mapped memory too.
constexpr std::size_t copy_piece = 256 * 1024;

void copy_in_pieces(char* to, const char* from, std::size_t bytes) {
  for (std::size_t done = 0; done < bytes; done += copy_piece)
    std::memcpy(to + done, from + done, std::min(copy_piece, bytes - done));
}

std::string outside_cause(std::uint64_t offset, std::uint64_t bytes, std::uint64_t region,
                          int owner) {
  return "bytes " + std::to_string(offset) + ".." + std::to_string(offset + bytes) +
         " are outside the region of " + std::to_string(region) + " bytes registered at rank " +
         std::to_string(owner);
}

}  // namespace

const char* Messenger::rma_name(RequestImpl::Kind kind) {
  switch (kind) {
    case RequestImpl::Kind::put:
      return "put";
    case RequestImpl::Kind::get:
      return "get";
    default:
      return "flush";
  }
}

std::string Messenger::stale_cause(int owner) {
  return "rank " + std::to_string(owner) +
         " has no region registered under this key now (it was deregistered, or the key comes "
         "from another communicator)";
}

Error Messenger::rma_error(const RequestImpl& op, ErrorKind kind, std::string cause) const {
  return Error(kind, {.rank = config_.rank,
                      .peer = op.peer,
                      .operation = rma_name(op.kind),
                      .cause = std::move(cause)});
}

RemoteKey Messenger::register_memory(void* data, std::size_t bytes) {
  if (data == nullptr && bytes > 0) {
    throw Error(ErrorKind::usage,
                {.rank = config_.rank,
                 .operation = "register_memory",
                 .cause = "null address for a region of " + std::to_string(bytes) + " bytes"});
  }
  return add_region(data, bytes, nullptr);
}

RemoteKey Messenger::allocate_memory(std::size_t bytes) {
  std::unique_ptr<base::SharedSegment> segment;
  try {
    segment = std::make_unique<base::SharedSegment>(
        "anview-region", segment_header_bytes + std::max<std::size_t>(bytes, 1));
  } catch (const std::system_error& e) {
    throw Error(ErrorKind::internal,
                {.rank = config_.rank,
                 .operation = "allocate_memory",
                 .cause = "no shared memory for " + std::to_string(bytes) + " bytes: " + e.what()});
  }
  char* data = segment->data() + segment_header_bytes;
  return add_region(data, bytes, std::move(segment));
}

RemoteKey Messenger::add_region(void* data, std::size_t bytes,
                                std::unique_ptr<base::SharedSegment> segment) {
  RemoteKey key;
  bool emulated = false;
  {
    Lock lock(mu_);
    if (closed_) {
      throw Error(ErrorKind::usage, {.rank = config_.rank,
                                     .operation = segment ? "allocate_memory" : "register_memory",
                                     .cause = "the communicator is closed"});
    }
    const RegionRecord& record = regions_.add(data, bytes);
    key = RemoteKey{.rank = config_.rank,
                    .token = record.token,
                    .address = record.address,
                    .bytes = record.bytes,
                    .record = reinterpret_cast<std::uint64_t>(&record),
                    .pid = static_cast<std::int32_t>(::getpid()),
                    .fd = -1};
    if (segment) {
      key.fd = segment->fd();
      header_address(segment->data()) = record.address;
      header_bytes(segment->data()) = record.bytes;
      header_scope(segment->data()) = record.scope;
      header_token(segment->data()).store(record.token, std::memory_order_release);
      segments_.emplace(record.token, std::move(segment));
    }
    for (int p = 0; p < config_.world_size; ++p) {
      const PeerState& ps = peers_[static_cast<std::size_t>(p)];
      if (p != config_.rank && ps.transport != nullptr && ps.transport->peer_memory(p) == nullptr)
        emulated = true;
    }
  }
  // Peers reach this region through frames: someone must serve them while we compute.
  if (emulated && config_.background_progress) start_background_progress();
  return key;
}

void Messenger::deregister_memory(std::uint64_t token) {
  std::unique_ptr<base::SharedSegment> segment;
  {
    Lock lock(mu_);
    regions_.remove(token);  // first: no frame and no key request is answered for it now
    auto it = segments_.find(token);
    if (it != segments_.end()) {
      segment = std::move(it->second);
      segments_.erase(it);
      // A peer's check fails from now on (a mapping it holds keeps the pages alive, so a put
      // already past its check lands in memory nobody reads).
      header_token(segment->data()).store(0, std::memory_order_release);
    }
  }
  // Peers holding a native key drop it before the memory goes (the segment lives until then).
  withdraw_native(token);
}

std::shared_ptr<char> Messenger::mapping(const transport::PeerMemory& memory,
                                         const RemoteKey& key) {
  const auto id = std::make_pair(key.rank, key.token);
  {
    Lock lock(mu_);
    if (auto it = mappings_.find(id); it != mappings_.end()) return it->second;
  }
  std::string why;
  std::shared_ptr<char> mapped =
      memory.map(key.fd, segment_header_bytes + std::max<std::uint64_t>(key.bytes, 1), &why);
  // Mapped as large as the key says: kept only if the owner's header says the same (a key
  // altered to a larger size must not leave a mapping that later keys trust).
  if (mapped && !segment_matches(mapped.get(), key, config_.job_id)) return nullptr;
  if (!mapped) {
    base::log("p2p", base::LogLevel::info, "rank ", key.rank,
              "'s allocated region is not mappable here (", why,
              "): puts and gets use cross-memory attach");
  }
  Lock lock(mu_);
  if (mappings_.size() >= max_mappings) mappings_.clear();  // in-flight users hold theirs
  return mappings_.emplace(id, std::move(mapped)).first->second;
}

RequestPtr Messenger::start_rma(RequestImpl::Kind kind, const RemoteKey& key, std::size_t bytes,
                                std::uint64_t offset) {
  auto op = new_request(shared_from_this(), kind, key.rank, Tag{0});
  if (key.rank < 0 || key.rank >= config_.world_size) {
    throw rma_error(*op, ErrorKind::usage,
                    "the key names rank " + std::to_string(key.rank) +
                        ", not a rank of this communicator (size " +
                        std::to_string(config_.world_size) + ")");
  }
  if (key.token == 0)
    throw rma_error(*op, ErrorKind::usage, "an empty key (no region was registered for it)");
  if (offset > key.bytes || bytes > key.bytes - offset)
    throw rma_error(*op, ErrorKind::usage, outside_cause(offset, bytes, key.bytes, key.rank));
  op->expected = bytes;
  op->status = Status{key.rank, Tag{0}, bytes};
  return op;
}

RequestPtr Messenger::put(const void* local, std::size_t bytes, const RemoteKey& key,
                          std::uint64_t offset) {
  RequestPtr op = start_rma(RequestImpl::Kind::put, key, bytes, offset);
  if (local == nullptr && bytes > 0)
    throw rma_error(*op, ErrorKind::usage, "null local buffer for a non-empty put");
  op->send_data = static_cast<const char*>(local);
  op->send_bytes = bytes;
  return issue_rma(op, key, offset);
}

RequestPtr Messenger::get(void* local, std::size_t bytes, const RemoteKey& key,
                          std::uint64_t offset) {
  RequestPtr op = start_rma(RequestImpl::Kind::get, key, bytes, offset);
  if (local == nullptr && bytes > 0)
    throw rma_error(*op, ErrorKind::usage, "null local buffer for a non-empty get");
  op->recv_data = static_cast<char*>(local);
  op->capacity = bytes;
  return issue_rma(op, key, offset);
}

RequestPtr Messenger::issue_rma(const RequestPtr& op, const RemoteKey& key, std::uint64_t offset) {
  const int peer = key.rank;
  const std::size_t bytes = op->expected;
  const transport::PeerMemory* direct = nullptr;
  std::shared_ptr<char> mapped;  // the owner's allocated region, mapped here
  bool map_now = false;          // not mapped yet: try
  Completions completed;
  // Completes an operation that ended at once; its failure is also the next flush's.
  auto finish_now = [&](std::optional<Error> error) {
    auto& failure = peers_[static_cast<std::size_t>(peer)].rma_failure;
    if (error && !failure) failure = error;
    complete(op, std::move(error));
  };
  {
    Lock lock(mu_);
    PeerState& ps = peers_[static_cast<std::size_t>(peer)];
    if (closed_) {
      finish_now(rma_error(*op, ErrorKind::usage, "the communicator is closed"));
    } else if (ps.failure) {
      finish_now(ps.failure->for_operation(rma_name(op->kind), std::nullopt));
    } else if (bytes == 0) {
      finish_now(std::nullopt);
    } else if (peer == config_.rank) {
      finish_now(local_rma(*op, key, offset));
    } else if (ps.transport != nullptr && (direct = ps.transport->peer_memory(peer)) != nullptr) {
      // Copied below, without the lock.
      if (key.fd >= 0) {
        auto it = mappings_.find(std::make_pair(key.rank, key.token));
        if (it != mappings_.end()) {
          mapped = it->second;  // null: not mappable, cross-memory attach instead
        } else {
          map_now = true;
        }
      }
    } else if (ps.transport != nullptr && ps.transport->remote_access(peer) != nullptr) {
      native_rma(op, key, offset);
    } else {
      emulate_rma(op, key, offset);
    }
    take_completed(completed);
  }
  if (direct != nullptr) {
    if (map_now) mapped = mapping(*direct, key);
    std::optional<Error> error =
        mapped ? mapped_rma(*op, mapped.get(), key, offset) : direct_rma(*op, *direct, key, offset);
    if (error) {
      Lock lock(mu_);
      // The owner's process is gone (the copy found it so before the link did): every later
      // operation with it fails the same way from now on, flushes included.
      PeerState& ps = peers_[static_cast<std::size_t>(peer)];
      if (error->kind() == ErrorKind::peer_lost && !ps.failure && ps.transport != nullptr)
        ps.transport->fail_peer(peer, *error);
      finish_now(std::move(error));
      take_completed(completed);
    } else {
      // Nobody else has seen the request yet (no callback, no waiter): complete it here
      // without the lock.
      op->phase = RequestImpl::Phase::complete;
      op->done.store(true, std::memory_order_release);
    }
  }
  run_callbacks(completed);
  return op;
}

std::optional<Error> Messenger::local_rma(RequestImpl& op, const RemoteKey& key,
                                          std::uint64_t offset) {
  const RegionRecord* record = regions_.find(key.token);
  if (record == nullptr || record->address != key.address || record->bytes != key.bytes)
    return rma_error(op, ErrorKind::usage, stale_cause(key.rank));
  char* region = reinterpret_cast<char*>(key.address) + offset;
  if (op.kind == RequestImpl::Kind::put) {
    std::memmove(region, op.send_data, op.send_bytes);
  } else {
    std::memmove(op.recv_data, region, op.capacity);
  }
  op.received = op.expected;
  return std::nullopt;
}

std::optional<Error> Messenger::direct_rma(RequestImpl& op, const transport::PeerMemory& memory,
                                           const RemoteKey& key, std::uint64_t offset) {
  const char* name = rma_name(op.kind);
  try {
    RegionRecord record;
    memory.read(key.record, &record, sizeof record, name);
    if (record.token != key.token || record.address != key.address || record.bytes != key.bytes ||
        record.scope != config_.job_id)
      return rma_error(op, ErrorKind::usage, stale_cause(key.rank));
    if (op.kind == RequestImpl::Kind::put) {
      memory.write(key.address + offset, op.send_data, op.send_bytes, name);
    } else {
      memory.read(key.address + offset, op.recv_data, op.capacity, name);
    }
  } catch (const Error& e) {
    return e;
  }
  op.received = op.expected;
  return std::nullopt;
}

std::optional<Error> Messenger::mapped_rma(RequestImpl& op, char* segment, const RemoteKey& key,
                                           std::uint64_t offset) {
  if (!segment_matches(segment, key, config_.job_id)) {
    Lock lock(mu_);
    mappings_.erase(std::make_pair(key.rank, key.token));
    return rma_error(op, ErrorKind::usage, stale_cause(key.rank));
  }
  char* region = segment + segment_header_bytes + offset;
  if (op.kind == RequestImpl::Kind::put) {
    copy_in_pieces(region, op.send_data, op.send_bytes);
  } else {
    copy_in_pieces(op.recv_data, region, op.capacity);
  }
  op.received = op.expected;
  return std::nullopt;
}

void Messenger::emulate_rma(const RequestPtr& op, const RemoteKey& key, std::uint64_t offset) {
  const int peer = key.rank;
  if (op->id == 0) {  // else it waited for a native key, in ps.rma already
    op->id = next_id_++;
    op->phase = RequestImpl::Phase::transferring;
    peers_[static_cast<std::size_t>(peer)].rma.emplace(op->id, op);
  }
  const std::uint64_t id = op->id;
  if (op->kind == RequestImpl::Kind::get) {
    transport::FrameHeader h;
    h.type = static_cast<std::uint8_t>(FrameType::get);
    h.payload_bytes = sizeof(GetRequest);
    h.tag = key.token;
    h.id = id;
    h.arg = offset;
    auto request = std::make_shared<GetRequest>(GetRequest{.bytes = op->expected});
    send_frame(peer, h, request.get(), transport::Ordering::ordered,
               [this, peer, id, request](const Error* e) {
                 if (e) finish_rma(peer, id, e->for_operation("get", std::nullopt));
               });
    return;
  }
  const std::size_t bytes = op->send_bytes;
  const std::size_t chunk = chunk_bytes(peer);
  // Each chunk points into the caller's buffer until the transport is done with it: the put
  // completes only after the last chunk's SendDone (finish_rma holds its outcome till then),
  // even when the owner refused it at the first chunk.
  for (std::size_t done = 0; done < bytes && !op->answered; done += chunk) {
    transport::FrameHeader h;
    h.type = static_cast<std::uint8_t>(FrameType::put);
    h.payload_bytes = static_cast<std::uint32_t>(std::min(chunk, bytes - done));
    h.tag = key.token;
    h.id = id;
    h.arg = offset + done;
    ++op->chunks_pending;
    send_frame(peer, h, op->send_data + done, transport::Ordering::any_stream,
               [this, peer, id, op](const Error* e) {
                 --op->chunks_pending;
                 if (e) finish_rma(peer, id, e->for_operation("put", std::nullopt));
                 if (op->chunks_pending == 0 && op->answered) complete_answered(op);
               });
  }
}

void Messenger::complete_answered(const RequestPtr& op) {
  op->answered = false;
  std::optional<Error> outcome = std::move(op->error);
  op->error.reset();
  complete(op, std::move(outcome));
}

void Messenger::reject_rma(int peer, FrameType type, std::uint64_t id, RmaReject why) {
  transport::FrameHeader h;
  h.type = static_cast<std::uint8_t>(type);
  h.flags = static_cast<std::uint8_t>(why);
  h.id = id;
  send_frame(peer, h, nullptr, transport::Ordering::ordered, nullptr);
}

transport::Landing Messenger::on_rma_frame(int peer, const transport::FrameHeader& h) {
  PeerState& ps = peers_[static_cast<std::size_t>(peer)];
  switch (static_cast<FrameType>(h.type)) {
    case FrameType::put: {  // we own the region
      const RegionRecord* region = regions_.find(h.tag);
      if (region == nullptr) {
        reject_rma(peer, FrameType::put_ack, h.id, RmaReject::unknown_region);
        return {};  // the transport drops the payload
      }
      if (h.payload_bytes == 0 || h.arg > region->bytes ||
          h.payload_bytes > region->bytes - h.arg) {
        reject_rma(peer, FrameType::put_ack, h.id, RmaReject::outside_region);
        return {};
      }
      return {.data = reinterpret_cast<char*>(region->address) + h.arg, .defer = false};
    }
    case FrameType::get:
      if (h.payload_bytes != sizeof(GetRequest)) {
        protocol_error(peer, "get frame with a payload of " + std::to_string(h.payload_bytes) +
                                 " bytes (expected " + std::to_string(sizeof(GetRequest)) + ")");
        return {};
      }
      return {.data = &ps.incoming_get, .defer = false};
    case FrameType::put_ack: {
      auto it = ps.rma.find(h.id);
      if (h.payload_bytes != 0) {
        protocol_error(peer, "put acknowledgement with a payload");
      } else if (it == ps.rma.end()) {
        // The put failed here already (a later chunk's refusal): nothing to do.
      } else if (it->second->kind != RequestImpl::Kind::put) {
        protocol_error(peer, "put acknowledgement for operation " + std::to_string(h.id) +
                                 ", which is not a put");
      } else if (h.flags != 0) {
        RequestImpl& op = *it->second;
        const auto why = static_cast<RmaReject>(h.flags);
        finish_rma(peer, h.id,
                   rma_error(op, ErrorKind::usage,
                             why == RmaReject::unknown_region
                                 ? stale_cause(peer)
                                 : "rank " + std::to_string(peer) +
                                       " found the range outside the region it registered"));
      } else {
        RequestImpl& op = *it->second;
        if (h.arg > op.expected - op.received) {
          protocol_error(peer, "put acknowledgement for more bytes than were sent");
        } else if ((op.received += h.arg) == op.expected) {
          finish_rma(peer, h.id, std::nullopt);
        }
      }
      return {};
    }
    case FrameType::get_data: {
      auto it = ps.rma.find(h.id);
      if (it == ps.rma.end()) return {};  // failed here already: drop the bytes
      RequestImpl& op = *it->second;
      if (op.kind != RequestImpl::Kind::get) {
        protocol_error(peer,
                       "get data for operation " + std::to_string(h.id) + ", which is not a get");
        return {};
      }
      if (h.flags != 0) {
        if (h.payload_bytes != 0) {
          protocol_error(peer, "a refused get with a payload");
          return {};
        }
        const auto why = static_cast<RmaReject>(h.flags);
        finish_rma(peer, h.id,
                   rma_error(op, ErrorKind::usage,
                             why == RmaReject::unknown_region
                                 ? stale_cause(peer)
                                 : "rank " + std::to_string(peer) +
                                       " found the range outside the region it registered"));
        return {};
      }
      if (h.payload_bytes == 0 || h.arg > op.expected || h.payload_bytes > op.expected - h.arg) {
        protocol_error(peer, "get data outside the get (offset " + std::to_string(h.arg) + ", " +
                                 std::to_string(h.payload_bytes) + " bytes of " +
                                 std::to_string(op.expected) + ")");
        return {};
      }
      return {.data = op.recv_data + h.arg, .defer = false};
    }
    default:
      return {};
  }
}

void Messenger::on_rma_frame_done(int peer, const transport::FrameHeader& h) {
  PeerState& ps = peers_[static_cast<std::size_t>(peer)];
  switch (static_cast<FrameType>(h.type)) {
    case FrameType::put: {
      transport::FrameHeader ack;
      ack.type = static_cast<std::uint8_t>(FrameType::put_ack);
      ack.id = h.id;
      ack.arg = h.payload_bytes;
      send_frame(peer, ack, nullptr, transport::Ordering::ordered, nullptr);
      return;
    }
    case FrameType::get: {
      const GetRequest request = ps.incoming_get;
      if (request.reserved != 0 || request.bytes == 0) {
        protocol_error(peer, "malformed get request (" + std::to_string(request.bytes) + " bytes)");
        return;
      }
      const RegionRecord* region = regions_.find(h.tag);
      if (region == nullptr) {
        reject_rma(peer, FrameType::get_data, h.id, RmaReject::unknown_region);
        return;
      }
      if (h.arg > region->bytes || request.bytes > region->bytes - h.arg) {
        reject_rma(peer, FrameType::get_data, h.id, RmaReject::outside_region);
        return;
      }
      const char* from = reinterpret_cast<const char*>(region->address) + h.arg;
      const std::size_t chunk = chunk_bytes(peer);
      for (std::uint64_t done = 0; done < request.bytes; done += chunk) {
        transport::FrameHeader d;
        d.type = static_cast<std::uint8_t>(FrameType::get_data);
        d.payload_bytes =
            static_cast<std::uint32_t>(std::min<std::uint64_t>(chunk, request.bytes - done));
        d.id = h.id;
        d.arg = done;
        send_frame(peer, d, from + done, transport::Ordering::any_stream, nullptr);
      }
      return;
    }
    case FrameType::get_data: {
      auto it = ps.rma.find(h.id);
      if (it == ps.rma.end()) return;
      RequestImpl& op = *it->second;
      if ((op.received += h.payload_bytes) == op.expected) finish_rma(peer, h.id, std::nullopt);
      return;
    }
    default:
      return;
  }
}

void Messenger::finish_rma(int peer, std::uint64_t id, std::optional<Error> error) {
  PeerState& ps = peers_[static_cast<std::size_t>(peer)];
  auto it = ps.rma.find(id);
  if (it == ps.rma.end()) return;
  RequestPtr op = std::move(it->second);
  ps.rma.erase(it);
  if (error) {
    bool reported = false;
    for (auto& f : ps.flushes) {
      if (id >= f->before) continue;
      reported = true;
      if (!f->error) f->error = error;
    }
    if (!reported && !ps.rma_failure) ps.rma_failure = error;
  }
  hold_or_complete(op, std::move(error));
  settle_flushes(ps);
}

void Messenger::hold_or_complete(const RequestPtr& op, std::optional<Error> outcome) {
  if (op->chunks_pending == 0) {
    complete(op, std::move(outcome));
    return;
  }
  // A put whose chunks the transport still holds: its outcome waits for the last SendDone.
  if (op->answered) return;  // the first outcome stands
  op->answered = true;
  op->error = std::move(outcome);
}

void Messenger::settle_flushes(PeerState& ps) {
  const std::uint64_t oldest =
      ps.rma.empty() ? std::numeric_limits<std::uint64_t>::max() : ps.rma.begin()->first;
  for (auto it = ps.flushes.begin(); it != ps.flushes.end();) {
    if ((*it)->before > oldest) {
      ++it;
      continue;
    }
    std::shared_ptr<Flush> f = std::move(*it);
    it = ps.flushes.erase(it);
    if (--f->peers_left == 0) complete(std::move(f->request), std::move(f->error));
  }
}

void Messenger::fail_rma(PeerState& ps, const Error& error) {
  ps.native_keys.clear();  // their waiting operations are among ps.rma
  // Operations lost with the peer that no flush waits for yet, and native puts never
  // flushed: the next flush reports them (a flush must not say they are in place).
  bool lost = ps.native_unflushed;
  ps.native_unflushed = false;
  for (auto& [id, op] : ps.rma) {
    bool covered = false;
    for (const auto& f : ps.flushes) covered = covered || id < f->before;
    lost = lost || !covered;
    hold_or_complete(op, error.for_operation(rma_name(op->kind), std::nullopt));
  }
  if (lost && !ps.rma_failure) ps.rma_failure = error.for_operation("flush", std::nullopt);
  ps.rma.clear();
  for (auto& f : ps.flushes) {
    if (!f->error) f->error = error.for_operation("flush", std::nullopt);
    if (--f->peers_left == 0) complete(std::move(f->request), std::move(f->error));
  }
  ps.flushes.clear();
}

RequestPtr Messenger::flush(int peer) {
  auto req = new_request(shared_from_this(), RequestImpl::Kind::flush, peer, Tag{0});
  if (peer != any_source && (peer < 0 || peer >= config_.world_size)) {
    throw rma_error(*req, ErrorKind::usage,
                    "peer " + std::to_string(peer) + " is not a rank of this communicator (size " +
                        std::to_string(config_.world_size) + ")");
  }
  Completions completed;
  {
    Lock lock(mu_);
    // Native puts complete when their buffer may be reused; the transport's flush is what
    // says they are in place at the target.
    for (int p = 0; p < config_.world_size; ++p)
      if (peer == any_source || p == peer) flush_native(p);
    auto f = std::make_shared<Flush>();
    f->request = req;
    f->before = next_id_;
    for (int p = 0; p < config_.world_size; ++p) {
      if (peer != any_source && p != peer) continue;
      PeerState& ps = peers_[static_cast<std::size_t>(p)];
      if (ps.rma_failure) {
        if (!f->error) f->error = std::move(ps.rma_failure);
        ps.rma_failure.reset();
      }
      // A flush of a lost peer's operations fails like any later operation with it.
      if (p == peer && ps.failure && !f->error)
        f->error = ps.failure->for_operation("flush", std::nullopt);
      if (ps.rma.empty() || ps.rma.begin()->first >= f->before) continue;
      ps.flushes.push_back(f);
      ++f->peers_left;
    }
    if (f->peers_left == 0) complete(req, std::move(f->error));
    take_completed(completed);
  }
  run_callbacks(completed);
  return req;
}

// Background progress -------------------------------------------------------------------------

void Messenger::start_background_progress() {
  std::lock_guard lock(background_mu_);
  if (background_on_.load() || background_stop_.load()) return;
  background_on_.store(true);
  background_ = std::thread([this] { background_progress(); });
}

void Messenger::stop_background_progress() {
  std::thread thread;
  {
    std::lock_guard lock(background_mu_);
    background_stop_.store(true);
    thread = std::move(background_);
  }
  if (!thread.joinable()) return;
  background_cv_.notify_all();
  engine_.wakeup();  // out of its sleep in epoll
  if (thread.get_id() == std::this_thread::get_id()) {
    thread.detach();  // a completion callback it ran closed the communicator
  } else {
    thread.join();
  }
}

void Messenger::background_progress() {
  // Drives progress while no thread of the rank does: sleeps in the kernel (epoll, shm
  // wake-ups) when idle. A thread that wants the role kicks it out of its sleep and it backs
  // off for a while, so the rank's own waits keep their busy-poll latency.
  std::unique_lock lock(background_mu_);
  while (!background_stop_.load()) {
    const bool back_off = role_wanted_.load() > 0 || role_kicked_.exchange(false);
    if (!back_off && take_driver_role()) {
      lock.unlock();
      background_driving_.store(true);
      drive(background_sleep_ms);
      background_driving_.store(false);
      release_driver_role();
      lock.lock();
      continue;
    }
    background_cv_.wait_for(lock, background_back_off, [&] { return background_stop_.load(); });
  }
}

void Messenger::kick_background() {
  if (!background_driving_.load(std::memory_order_relaxed)) return;
  role_kicked_.store(true);
  engine_.wakeup();
}

}  // namespace anview::p2p
