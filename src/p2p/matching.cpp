#include "p2p/matching.hpp"

#include <algorithm>

namespace anview::p2p {
namespace {

// any_tag matches user tags only: the reserved ones carry collectives' internal traffic.
bool tag_matches(Tag wanted, std::uint64_t tag) {
  return wanted == any_tag ? tag < reserved_tags : to_underlying(wanted) == tag;
}

}  // namespace

void PostedQueue::push(RequestPtr recv) {
  recv->post_order = next_order_++;
  auto& list =
      recv->peer == any_source ? any_source_ : by_source_[static_cast<std::size_t>(recv->peer)];
  list.push_back(std::move(recv));
}

RequestPtr PostedQueue::find(int source, std::uint64_t tag, bool take) {
  auto& mine = by_source_[static_cast<std::size_t>(source)];
  auto matching = [&](const RequestPtr& r) { return tag_matches(r->tag, tag); };
  // The common case, receives of one source matched in the order they were posted: the
  // oldest one matches and no wildcard receive competes.
  if (any_source_.empty() && !mine.empty() && matching(mine.front())) {
    if (!take) return mine.front();
    RequestPtr r = std::move(mine.front());
    mine.pop_front();
    return r;
  }
  auto a = std::find_if(mine.begin(), mine.end(), matching);
  auto b = std::find_if(any_source_.begin(), any_source_.end(), matching);
  const bool use_a =
      a != mine.end() && (b == any_source_.end() || (*a)->post_order < (*b)->post_order);
  if (!use_a && b == any_source_.end()) return nullptr;
  auto& list = use_a ? mine : any_source_;
  auto it = use_a ? a : b;
  if (!take) return *it;
  RequestPtr r = std::move(*it);
  if (it == list.begin())
    list.pop_front();
  else
    list.erase(it);
  return r;
}

bool PostedQueue::remove(const detail::RequestImpl& recv) {
  auto& list =
      recv.peer == any_source ? any_source_ : by_source_[static_cast<std::size_t>(recv.peer)];
  auto it =
      std::find_if(list.begin(), list.end(), [&](const RequestPtr& r) { return r.get() == &recv; });
  if (it == list.end()) return false;
  list.erase(it);
  return true;
}

std::vector<RequestPtr> PostedQueue::take_from(int source, bool with_any) {
  auto& mine = by_source_[static_cast<std::size_t>(source)];
  std::vector<RequestPtr> out(mine.begin(), mine.end());
  mine.clear();
  if (with_any) {
    out.insert(out.end(), any_source_.begin(), any_source_.end());
    any_source_.clear();
  }
  return out;
}

std::vector<RequestPtr> PostedQueue::take_all() {
  std::vector<RequestPtr> out(any_source_.begin(), any_source_.end());
  any_source_.clear();
  for (auto& list : by_source_) {
    out.insert(out.end(), list.begin(), list.end());
    list.clear();
  }
  return out;
}

std::vector<RequestPtr> PostedQueue::snapshot(std::size_t limit) const {
  std::vector<RequestPtr> out;
  for (const auto& r : any_source_) {
    if (out.size() >= limit) return out;
    out.push_back(r);
  }
  for (const auto& list : by_source_) {
    for (const auto& r : list) {
      if (out.size() >= limit) return out;
      out.push_back(r);
    }
  }
  return out;
}

UnexpectedQueue::Iterator UnexpectedQueue::push(Unexpected message) {
  message.order = next_order_++;
  auto& list = by_source_[static_cast<std::size_t>(message.source)];
  list.push_back(std::move(message));
  return std::prev(list.end());
}

std::optional<UnexpectedQueue::Iterator> UnexpectedQueue::find(int source, Tag tag) {
  std::optional<Iterator> best;
  auto search = [&](std::list<Unexpected>& list) {
    auto it = std::find_if(list.begin(), list.end(), [&](const Unexpected& u) {
      return !u.waiting && tag_matches(tag, u.tag);
    });
    if (it != list.end() && (!best || it->order < (*best)->order)) best = it;
  };
  if (source != any_source) {
    search(by_source_[static_cast<std::size_t>(source)]);
  } else {
    for (auto& list : by_source_) search(list);
  }
  return best;
}

void UnexpectedQueue::erase(Iterator it) {
  by_source_[static_cast<std::size_t>(it->source)].erase(it);
}

void UnexpectedQueue::clear() {
  for (auto& list : by_source_) list.clear();
}

}  // namespace anview::p2p
