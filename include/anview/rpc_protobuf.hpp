// Optional: protobuf messages as RPC payloads. Header-only; include it where protobuf is used
// and link libprotobuf (Debian: libprotobuf-dev; CMake: find_package(Protobuf),
// protobuf::libprotobuf). Parse failures are anview::Error(protocol) naming the type; in a
// handler they reach the client as ErrorKind::remote with that message.
#pragma once

#include <climits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <google/protobuf/message_lite.h>

#include "anview/error.hpp"
#include "anview/message.hpp"
#include "anview/rpc.hpp"

namespace anview {

// Serializes `proto` into a Message that owns the bytes.
inline Message to_message(const google::protobuf::MessageLite& proto) {
  std::vector<std::byte> bytes(proto.ByteSizeLong());
  if (!proto.SerializeToArray(bytes.data(), static_cast<int>(bytes.size())))
    throw Error(ErrorKind::usage, {.operation = "protobuf",
                                   .cause = "cannot serialize a " + proto.GetTypeName() +
                                            " (required fields missing?)"});
  return Message(std::move(bytes));
}

// Parses a Message's bytes as a `Proto`.
template <typename Proto>
Proto from_message(const Message& message) {
  Proto proto;
  if (message.size() > static_cast<std::size_t>(INT_MAX) ||
      !proto.ParseFromArray(message.bytes().data(), static_cast<int>(message.size())))
    throw Error(ErrorKind::protocol, {.operation = "protobuf",
                                      .cause = std::to_string(message.size()) +
                                               " bytes that are not a " + proto.GetTypeName()});
  return proto;
}

// Registers `fn(const CallContext&, const Request&) -> Reply` as method `name`.
template <typename Request, typename Fn>
void add_protobuf_method(RpcServer& server, std::string name, Fn fn) {
  server.add_method(std::move(name),
                    [fn = std::move(fn)](const CallContext& context, const Message& request) {
                      return to_message(fn(context, from_message<Request>(request)));
                    });
}

// Calls `method` with a protobuf request and parses its reply as a `Reply`.
template <typename Reply>
Reply call_protobuf(RpcClient& client, std::string_view method,
                    const google::protobuf::MessageLite& request, CallOptions options = {}) {
  return from_message<Reply>(client.call_sync(method, to_message(request), options));
}

}  // namespace anview
