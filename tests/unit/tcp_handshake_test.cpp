// transport/tcp handshake validation: every field of a hello is checked.
#include <gtest/gtest.h>

#include "transport/tcp/handshake.hpp"

namespace anview::transport::tcp {
namespace {

const HandshakeExpectation expected{
    .job_id = 77, .world_size = 4, .my_rank = 2, .stream_count = 2, .has_secret = false};

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

TEST(TcpHandshake, BothSidesMustHaveAJobSecretOrNeither) {
  std::string why;
  Handshake h = good_hello();
  h.auth = 1;
  EXPECT_EQ(check(h, nullptr, &why), RejectReason::auth);
  EXPECT_NE(why.find("this rank has none"), std::string::npos) << why;
  HandshakeExpectation with_secret = expected;
  with_secret.has_secret = true;
  bool foreign = false;
  EXPECT_EQ(check_hello(h, with_secret, &foreign, &why), RejectReason::none);
  h.auth = 0;
  EXPECT_EQ(check_hello(h, with_secret, &foreign, &why), RejectReason::auth);
  EXPECT_NE(why.find("without the job secret"), std::string::npos) << why;
  EXPECT_FALSE(foreign);
}

// The proofs bind the secret, both nonces, the role and what the connection is for: change
// any one and the proof changes.
TEST(TcpHandshake, ProofsBindSecretNoncesRoleAndConnection) {
  const base::auth::Secret secret("s3cret");
  Handshake hello = good_hello();
  hello.auth = 1;
  hello.nonce = base::auth::fresh_nonce();
  Handshake ack = hello;
  ack.kind = HandshakeKind::ack;
  ack.rank = 2;
  ack.nonce = base::auth::fresh_nonce();
  const auto accept = accept_proof(secret, hello, ack);
  EXPECT_EQ(accept, accept_proof(secret, hello, ack));   // deterministic
  EXPECT_NE(accept, connect_proof(secret, hello, ack));  // a proof cannot be reflected
  EXPECT_NE(accept, accept_proof(base::auth::Secret("other"), hello, ack));
  Handshake replay = ack;
  replay.nonce = base::auth::fresh_nonce();  // the accepting side's fresh challenge
  EXPECT_NE(connect_proof(secret, hello, ack), connect_proof(secret, hello, replay));
  Handshake other_stream = hello;
  other_stream.stream = 0;
  EXPECT_NE(accept, accept_proof(secret, other_stream, ack));
  Handshake other_job = hello;
  other_job.job_id = 78;
  EXPECT_NE(accept, accept_proof(secret, other_job, ack));
  Handshake other_rank = hello;
  other_rank.rank = 0;
  EXPECT_NE(accept, accept_proof(secret, other_rank, ack));
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
  reply.version = 9;
  reply.reason = RejectReason::version;
  const std::string text = explain_reject(reply, 5);
  EXPECT_NE(text.find("rank 5"), std::string::npos);
  EXPECT_NE(text.find("version 9"), std::string::npos);
  EXPECT_NE(text.find("this process speaks " + std::to_string(protocol_version)),
            std::string::npos);
}

}  // namespace
}  // namespace anview::transport::tcp
