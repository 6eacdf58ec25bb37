// The RPC frame (docs/rpc.md): what encode() writes, parse() reads back; what parse() refuses,
// it says why.
#include <gtest/gtest.h>

#include <cstring>

#include "patterns/rpc_frame.hpp"

namespace anview::patterns::rpc {
namespace {

std::vector<std::byte> request_with(const Message& m, bool inline_payload = true) {
  return encode(Kind::request, flag_idempotent, ReplyStatus::ok, 42, 1500, 4096, "echo", m,
                inline_payload);
}

std::string refusal(std::vector<std::byte> bytes, Limits limits = {}) {
  Frame f;
  std::string why;
  EXPECT_FALSE(parse(bytes, limits, f, why));
  return why;
}

TEST(RpcFrame, RoundTripsEveryField) {
  const float data[6] = {1, 2, 3, 4, 5, 6};
  Message m("payload");
  m.add_tensor({.dtype = DataType::float32, .shape = {2, 3}, .data = data});
  const auto bytes = request_with(m);
  EXPECT_EQ(bytes.size(), frame_size("echo", m.tensors(), m.size()));
  Frame f;
  std::string why;
  ASSERT_TRUE(parse(bytes, {}, f, why)) << why;
  EXPECT_EQ(f.kind, Kind::request);
  EXPECT_EQ(f.flags, flag_idempotent | flag_inline_payload);
  EXPECT_EQ(f.call_id, 42u);
  EXPECT_EQ(f.deadline_ms, 1500u);
  EXPECT_EQ(f.reply_capacity, 4096u);
  EXPECT_EQ(f.text, "echo");
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_EQ(f.tensors[0].dtype, DataType::float32);
  EXPECT_EQ(f.tensors[0].shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(f.tensors[0].bytes, 24u);
  EXPECT_EQ(
      std::string(reinterpret_cast<const char*>(f.inline_payload.data()), f.inline_payload.size()),
      "payload");
  EXPECT_EQ(f.body_bytes(), 24u);  // the tensor follows; the payload was inline
}

TEST(RpcFrame, PayloadApartIsCountedInTheBody) {
  const auto bytes = request_with(Message(std::string(1000, 'p')), false);
  Frame f;
  std::string why;
  ASSERT_TRUE(parse(bytes, {}, f, why)) << why;
  EXPECT_FALSE(f.payload_inline());
  EXPECT_EQ(f.payload_bytes, 1000u);
  EXPECT_EQ(f.body_bytes(), 1000u);
}

TEST(RpcFrame, RefusesWhatBreaksTheFormatOrTheLimits) {
  auto good = request_with(Message("x"));
  EXPECT_NE(refusal({good.begin(), good.begin() + 20}).find("shorter"), std::string::npos);
  auto bad = good;
  bad[0] = std::byte{0};
  EXPECT_NE(refusal(bad).find("magic"), std::string::npos);
  bad = good;
  bad[4] = std::byte{9};
  EXPECT_NE(refusal(bad).find("version 9"), std::string::npos);
  bad = good;
  bad[5] = std::byte{7};
  EXPECT_NE(refusal(bad).find("kind"), std::string::npos);
  bad = good;
  bad.push_back(std::byte{1});
  EXPECT_NE(refusal(bad).find("inline payload"), std::string::npos);
  EXPECT_NE(refusal(request_with(Message(std::string(5000, 'x'))), {.max_message_bytes = 4096})
                .find("limit"),
            std::string::npos);
  // A tensor whose shape multiplies past the limit (and past 64 bits).
  Message huge;
  huge.add_tensor({.dtype = DataType::float64, .shape = {1 << 30, 1 << 30, 1 << 30}});
  EXPECT_NE(refusal(request_with(huge, false)).find("limit"), std::string::npos);
  Message negative;
  negative.add_tensor({.dtype = DataType::int8, .shape = {-1}});
  EXPECT_NE(refusal(request_with(negative, false)).find("dimension"), std::string::npos);
  EXPECT_NE(refusal(encode(Kind::request, 0, ReplyStatus::ok, 1, 0, 0, "", Message(), true))
                .find("method"),
            std::string::npos);
  EXPECT_NE(
      refusal(encode(Kind::request, 0, ReplyStatus::ok, max_call_id, 0, 0, "m", Message(), true))
          .find("call id"),
      std::string::npos);
}

}  // namespace
}  // namespace anview::patterns::rpc
