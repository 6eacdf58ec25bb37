// The state behind an anview::Request. Fields other than `done` are guarded by the owning
// Messenger's mutex; `done` is set (release) after everything else is final, so a reader that
// sees done == true (acquire) may read status and error without the lock.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "anview/request.hpp"
#include "base/clock.hpp"

namespace anview::p2p {
class Messenger;
}

namespace anview::detail {

class RequestImpl {
 public:
  // external: completed by a layer above p2p (a collective on its worker thread), never by a
  // transport; `peer` is -1 and `operation` names it.
  // put, get, flush: one-sided operations (one_sided.cpp); `peer` is the target.
  enum class Kind : std::uint8_t { send, recv, external, put, get, flush };
  enum class Phase : std::uint8_t {
    posted,        // recv: waiting for a match; send: queued eagerly or waiting for CTS
    matched,       // recv: matched, payload arriving
    transferring,  // send: CTS received, data frames queued
    complete,
  };

  RequestImpl(std::shared_ptr<p2p::Messenger> owner_, Kind kind_, int peer_, Tag tag_)
      : owner(std::move(owner_)), kind(kind_), peer(peer_), tag(tag_) {}

  std::shared_ptr<p2p::Messenger> owner;
  const Kind kind;
  const int peer;  // as posted: any_source allowed for receives
  const Tag tag;   // as posted: any_tag allowed for receives
  std::uint64_t id = 0;
  std::uint64_t post_order = 0;  // receives: when it was posted, for wildcard matching
  Phase phase = Phase::posted;
  base::Clock::time_point posted{};  // set only while ANVIEW_TRACE records transfers

  // send, put
  const char* send_data = nullptr;
  std::size_t send_bytes = 0;
  std::size_t chunks_pending = 0;
  // put: its outcome came (in `error`) while the transport still held chunks of it; it
  // completes when the last one is let go.
  bool answered = false;
  // recv, get (expected and received also count a put's acknowledged bytes)
  char* recv_data = nullptr;
  std::size_t capacity = 0;
  std::size_t expected = 0;  // bytes of the matched message
  std::size_t received = 0;
  // recv by rendezvous: the parts of the message its data frames cover, [begin, end), sorted,
  // adjacent ones merged (one, usually); a frame over a part already covered is refused.
  std::vector<std::pair<std::size_t, std::size_t>> covered;

  // external
  std::string operation;
  // Set by the layer that runs the operation (before the request is shared): runs it on the
  // calling thread if it has not started and nothing runs ahead of it; true when it did, the
  // request being complete then. Messenger::wait() calls it so that a thread waiting for a
  // queued collective runs it itself instead of waking another thread and sleeping.
  std::function<bool()> run_here;

  Status status;
  std::optional<Error> error;
  Request::Callback callback;
  std::atomic<bool> done{false};
  // Set while a transport holds a plain pointer to this request (an eager send in flight);
  // Messenger::complete() releases it.
  std::shared_ptr<RequestImpl> keep_alive;
};

}  // namespace anview::detail
