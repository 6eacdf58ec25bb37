// The optional protobuf helper (anview/rpc_protobuf.hpp) with protobuf's own well-known types.
#include <google/protobuf/wrappers.pb.h>
#include <gtest/gtest.h>

#include "anview/rpc_protobuf.hpp"

namespace anview {
namespace {

using google::protobuf::Int64Value;
using google::protobuf::StringValue;

TEST(RpcProtobuf, TypedMethodsRoundTripAndBadBytesAreNamed) {
  RpcServer server = RpcServer::listen("127.0.0.1:0");
  add_protobuf_method<StringValue>(
      server, "length", [](const CallContext&, const StringValue& request) {
        Int64Value reply;
        reply.set_value(static_cast<std::int64_t>(request.value().size()));
        return reply;
      });
  RpcClient client = RpcClient::connect(server.address());
  StringValue request;
  request.set_value(std::string(5000, 'q'));
  EXPECT_EQ(call_protobuf<Int64Value>(client, "length", request).value(), 5000);
  try {
    client.call_sync("length", Message(std::string("\xff\xff\xff", 3)));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::remote);
    EXPECT_NE(std::string(e.what()).find("not a google.protobuf.StringValue"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace anview
