// transport/tcp handshake validation: every field of a hello is checked.
#include <gtest/gtest.h>

#include "transport/tcp/handshake.hpp"

namespace anview::transport::tcp {
namespace {

const HandshakeExpectation expected{.job_id = 77, .world_size = 4, .my_rank = 2, .stream_count = 2};

Handshake good_hello() {
  Handshake h;
  h.job_id = 77;
  h.rank = 1;
  h.world_size = 4;
  h.stream = 1;
  h.stream_count = 2;
  return h;
}

RejectReason check(const Handshake& h, bool* foreign = nullptr, std::string* why = nullptr) {
  bool f = false;
  std::string w;
  const auto r = check_hello(h, expected, foreign ? foreign : &f, why ? why : &w);
  return r;
}

TEST(TcpHandshake, AcceptsAHelloOfThisJob) { EXPECT_EQ(check(good_hello()), RejectReason::none); }

TEST(TcpHandshake, WrongMagicIsForeignAndNotAnswered) {
  Handshake h = good_hello();
  h.magic = 0x50545448;  // "HTTP"
  bool foreign = false;
  check(h, &foreign);
  EXPECT_TRUE(foreign);
}

TEST(TcpHandshake, EachMismatchHasItsReason) {
  std::string why;
  Handshake h = good_hello();
  h.version = 1;  // before frames carried sequence numbers
  EXPECT_EQ(check(h, nullptr, &why), RejectReason::version);
  EXPECT_NE(why.find("version 1"), std::string::npos) << why;
  h = good_hello();
  h.job_id = 78;
  EXPECT_EQ(check(h), RejectReason::job);
  h = good_hello();
  h.world_size = 8;
  EXPECT_EQ(check(h), RejectReason::world_size);
  h = good_hello();
  h.rank = 3;  // a higher rank never connects to a lower one
  EXPECT_EQ(check(h), RejectReason::rank);
  h = good_hello();
  h.rank = 2;  // not from ourselves either
  EXPECT_EQ(check(h), RejectReason::rank);
  h = good_hello();
  h.stream_count = 4;
  EXPECT_EQ(check(h), RejectReason::streams);
  h = good_hello();
  h.stream = 2;
  EXPECT_EQ(check(h), RejectReason::streams);
  h = good_hello();
  set_path_fields(h, {.path = 2, .path_count = 2, .generation = 1});  // paths 0 and 1 only
  EXPECT_EQ(check(h, nullptr, &why), RejectReason::streams);
  EXPECT_NE(why.find("path 2 of 2"), std::string::npos) << why;
}

TEST(TcpHandshake, PathFieldsShareTheReasonSlotOfAHello) {
  Handshake h = good_hello();
  EXPECT_EQ(path_fields(h).path, 0);
  EXPECT_EQ(path_fields(h).path_count, 1);  // a zero count (a hello from a single path) is one
  set_path_fields(h, {.path = 1, .path_count = 3, .generation = 0xBEEF});
  const PathFields f = path_fields(h);
  EXPECT_EQ(f.path, 1);
  EXPECT_EQ(f.path_count, 3);
  EXPECT_EQ(f.generation, 0xBEEF);
  EXPECT_EQ(check(h), RejectReason::none);
}

TEST(TcpHandshake, RejectExplanationNamesThePeerAndVersions) {
  Handshake reply;
  reply.kind = HandshakeKind::reject;
  reply.version = 3;
  reply.reason = RejectReason::version;
  const std::string text = explain_reject(reply, 5);
  EXPECT_NE(text.find("rank 5"), std::string::npos);
  EXPECT_NE(text.find("version 3"), std::string::npos);
  EXPECT_NE(text.find("this process speaks 2"), std::string::npos);
}

}  // namespace
}  // namespace anview::transport::tcp
