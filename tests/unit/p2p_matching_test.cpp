// p2p matching queues: MPI order across the per-source buckets.
#include <gtest/gtest.h>

#include "p2p/matching.hpp"

namespace anview::p2p {
namespace {

RequestPtr recv(int source, Tag tag) {
  return std::make_shared<detail::RequestImpl>(nullptr, detail::RequestImpl::Kind::recv, source, tag);
}

TEST(PostedQueue, EarliestPostedMatchWinsAcrossSpecificAndAnySource) {
  PostedQueue q(3);
  auto any = recv(any_source, any_tag);
  auto from1 = recv(1, Tag{5});
  auto from1_tag6 = recv(1, Tag{6});
  q.push(from1_tag6);
  q.push(any);
  q.push(from1);
  EXPECT_EQ(q.find(1, 5, false), any);  // posted before from1
  EXPECT_EQ(q.find(1, 6, true), from1_tag6);
  EXPECT_EQ(q.find(1, 5, true), any);
  EXPECT_EQ(q.find(1, 5, true), from1);
  EXPECT_EQ(q.find(1, 5, true), nullptr);
  EXPECT_EQ(q.find(2, 5, false), nullptr);
}

TEST(PostedQueue, OneSourceInPostOrderAndPastANonMatchingFront) {
  PostedQueue q(2);
  auto first = recv(1, Tag{5}), second = recv(1, Tag{5}), other = recv(1, Tag{7});
  q.push(first);
  q.push(second);
  EXPECT_EQ(q.find(1, 5, false), first);  // a look leaves it queued
  EXPECT_EQ(q.find(1, 5, true), first);
  q.push(other);
  EXPECT_EQ(q.find(1, 7, true), other);  // behind `second`, which stays first in line
  EXPECT_EQ(q.find(1, 5, true), second);
  EXPECT_EQ(q.find(1, 5, true), nullptr);
  EXPECT_EQ(q.find(0, 5, true), nullptr);
}

TEST(PostedQueue, RemoveAndTakeFrom) {
  PostedQueue q(3);
  auto a = recv(0, Tag{1}), b = recv(2, Tag{1}), c = recv(any_source, Tag{1});
  q.push(a);
  q.push(b);
  q.push(c);
  EXPECT_TRUE(q.remove(*b));
  EXPECT_FALSE(q.remove(*b));
  EXPECT_EQ(q.take_from(0, false).size(), 1u);
  EXPECT_EQ(q.take_from(2, true).size(), 1u);  // only c is left
  EXPECT_TRUE(q.take_all().empty());
}

TEST(UnexpectedQueue, AnySourceTakesTheEarliestArrival) {
  UnexpectedQueue q(3);
  q.push(Unexpected{.source = 2, .tag = 7, .bytes = 1, .rendezvous = false});
  q.push(Unexpected{.source = 1, .tag = 7, .bytes = 2, .rendezvous = false});
  q.push(Unexpected{.source = 1, .tag = 8, .bytes = 3, .rendezvous = false});
  auto first = q.find(any_source, Tag{7});
  ASSERT_TRUE(first);
  EXPECT_EQ((*first)->source, 2);
  auto from1 = q.find(1, any_tag);
  ASSERT_TRUE(from1);
  EXPECT_EQ((*from1)->bytes, 2u);
  q.erase(*from1);
  EXPECT_EQ((*q.find(1, any_tag))->bytes, 3u);
  EXPECT_FALSE(q.find(0, any_tag));
}

TEST(UnexpectedQueue, MessagesAReceiveWaitsOnAreSkipped) {
  UnexpectedQueue q(2);
  auto it = q.push(Unexpected{.source = 1, .tag = 1, .bytes = 1, .rendezvous = false});
  it->waiting = recv(1, Tag{1});
  EXPECT_FALSE(q.find(1, Tag{1}));
}

}  // namespace
}  // namespace anview::p2p
