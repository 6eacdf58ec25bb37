// The two matching queues of the p2p engine, bucketed by source so that an arrival scans only
// the receives that could match it (and a receive only the messages of its source): with
// 10,000 receives posted per peer, one flat list made matching quadratic. Order across
// buckets (post order, arrival order) is kept with a sequence number, so wildcard matching is
// exactly MPI's.
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <optional>
#include <vector>

#include "p2p/request_impl.hpp"

namespace anview::p2p {

using RequestPtr = std::shared_ptr<detail::RequestImpl>;

// Receives waiting for a message.
class PostedQueue {
 public:
  explicit PostedQueue(int world_size) : by_source_(static_cast<std::size_t>(world_size)) {}

  void push(RequestPtr recv);
  // The earliest-posted receive that matches a message from `source` with `tag`; removed from
  // the queue when `take`.
  RequestPtr find(int source, std::uint64_t tag, bool take);
  // Removes `recv` if it is queued; false when it is not.
  bool remove(const detail::RequestImpl& recv);
  // Removes and returns the receives posted for `source`, and the any_source ones too when
  // `with_any`.
  std::vector<RequestPtr> take_from(int source, bool with_any);
  std::vector<RequestPtr> take_all();
  // The queued receives, at most `limit` (for dumps).
  std::vector<RequestPtr> snapshot(std::size_t limit) const;

 private:
  // Deques: posting and matching at the ends allocate nothing per receive.
  std::vector<std::deque<RequestPtr>> by_source_;
  std::deque<RequestPtr> any_source_;
  std::uint64_t next_order_ = 0;
};

// A message that arrived before its receive.
struct Unexpected {
  int source;
  std::uint64_t tag;
  std::size_t bytes;
  bool rendezvous;
  std::uint64_t sender_id;       // rendezvous: the sender's request id
  std::unique_ptr<char[]> data;  // eager payload
  bool complete = true;          // eager payload fully arrived
  RequestPtr waiting;            // a receive matched it before its payload arrived
  std::uint64_t order = 0;       // arrival order, across sources
};

class UnexpectedQueue {
 public:
  using Iterator = std::list<Unexpected>::iterator;

  explicit UnexpectedQueue(int world_size) : by_source_(static_cast<std::size_t>(world_size)) {}

  Iterator push(Unexpected message);
  // The earliest-arrived message a receive for (source or any_source, tag or any_tag) matches
  // that no receive is waiting on yet.
  std::optional<Iterator> find(int source, Tag tag);
  void erase(Iterator it);
  std::list<Unexpected>& from(int source) { return by_source_[static_cast<std::size_t>(source)]; }
  const std::list<Unexpected>& from(int source) const {
    return by_source_[static_cast<std::size_t>(source)];
  }
  void clear();

 private:
  std::vector<std::list<Unexpected>> by_source_;
  std::uint64_t next_order_ = 0;
};

}  // namespace anview::p2p
