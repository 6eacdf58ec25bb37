// Recycled request blocks: reuse on the freeing thread, requests intact, no leak at thread exit
// (the ASan build's LeakSanitizer checks that; it also keeps nothing, so reuse is not asserted
// there).
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <thread>
#include <type_traits>
#include <vector>

#include "p2p/request_pool.hpp"

namespace anview::p2p {
namespace {

using detail::RequestImpl;

TEST(RequestPool, AFreedRequestBlockIsHandedOutAgain) {
  const void* first = nullptr;
  {
    auto r = new_request(nullptr, RequestImpl::Kind::recv, 3, Tag{9});
    EXPECT_EQ(r->peer, 3);
    EXPECT_EQ(r->tag, Tag{9});
    EXPECT_FALSE(r->done.load());
    r->capacity = 77;
    first = r.get();
  }
  auto again = new_request(nullptr, RequestImpl::Kind::send, 1, Tag{2});
  if (requests_recycled) {
    EXPECT_EQ(static_cast<const void*>(again.get()), first);
  }
  // A recycled block is a new request: nothing of the previous one shows.
  EXPECT_EQ(again->kind, RequestImpl::Kind::send);
  EXPECT_EQ(again->capacity, 0u);
  EXPECT_EQ(again->peer, 1);
  EXPECT_EQ(again.use_count(), 1);
  // No weak self-reference (enable_shared_from_this): the last release of a request takes no
  // atomic read-modify-write, and completions pass their references along instead.
  static_assert(!std::is_base_of_v<std::enable_shared_from_this<RequestImpl>, RequestImpl>);
}

TEST(RequestPool, LiveRequestsAreDistinctAndAThreadKeepsAtMostItsLimit) {
  std::vector<std::shared_ptr<RequestImpl>> live;
  std::set<const void*> addresses;
  for (int i = 0; i < 500; ++i) {
    live.push_back(new_request(nullptr, RequestImpl::Kind::recv, i, Tag{0}));
    addresses.insert(live.back().get());
  }
  EXPECT_EQ(addresses.size(), 500u);
  for (int i = 0; i < 500; ++i) EXPECT_EQ(live[static_cast<std::size_t>(i)]->peer, i);
  live.clear();  // 64 kept, the rest freed: LeakSanitizer would see a lost one
}

TEST(RequestPool, RequestsMayBeFreedOnAnotherThreadAndThatThreadsCacheIsFreedAtExit) {
  std::vector<std::shared_ptr<RequestImpl>> made;
  for (int i = 0; i < 100; ++i)
    made.push_back(new_request(nullptr, RequestImpl::Kind::recv, i, Tag{0}));
  std::jthread other([&] {
    made.clear();  // to that thread's cache (up to its limit), then freed when it ends
    auto r = new_request(nullptr, RequestImpl::Kind::recv, 5, Tag{1});
    EXPECT_EQ(r->peer, 5);
  });
  other.join();
  auto here = new_request(nullptr, RequestImpl::Kind::recv, 6, Tag{1});
  EXPECT_EQ(here->peer, 6);
}

}  // namespace
}  // namespace anview::p2p
