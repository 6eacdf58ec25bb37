#include "patterns/rpc_transfer.hpp"

#include <new>

#include "patterns/connection.hpp"

namespace anview::patterns::rpc {
namespace {

// A receive buffer for a tensor, aligned for any element type.
std::shared_ptr<std::byte[]> tensor_buffer(std::size_t bytes) {
  return std::shared_ptr<std::byte[]>(
      new (std::align_val_t{64}) std::byte[bytes ? bytes : 1],
      [](std::byte* p) { ::operator delete[](p, std::align_val_t{64}); });
}

}  // namespace

std::vector<Request> receive_body(Communicator& comm, int peer, Tag tag, const Frame& frame,
                                  Message& message) {
  std::vector<Request> parts;
  if (frame.payload_inline()) {
    message = Message(frame.inline_payload);
  } else {
    message = Message(std::vector<std::byte>(frame.payload_bytes));
    if (frame.payload_bytes > 0)
      parts.push_back(comm.irecv(const_cast<std::byte*>(message.bytes().data()),
                                 frame.payload_bytes, peer, tag));
  }
  for (const auto& desc : frame.tensors) {
    auto buffer = tensor_buffer(desc.bytes);
    message.add_tensor({.dtype = desc.dtype, .shape = desc.shape, .data = buffer.get()});
    if (desc.bytes > 0) parts.push_back(comm.irecv(buffer.get(), desc.bytes, peer, tag));
    message.keep_alive(std::move(buffer));
  }
  return parts;
}

std::vector<Request> send_with_body(Communicator& comm, int peer, Tag frame_tag, Tag body_tag,
                                    std::vector<std::byte> frame, const Message& message,
                                    bool payload_inline) {
  send_owned(comm, peer, frame_tag, std::move(frame));
  auto held = std::make_shared<Message>(message);
  auto keep = [held](const Status&, const Error*) {};
  std::vector<Request> parts;
  auto send = [&](const void* data, std::size_t bytes) {
    parts.push_back(comm.isend(data, bytes, peer, body_tag));
    parts.back().on_complete(keep);
  };
  if (!payload_inline && message.size() > 0) send(message.bytes().data(), message.size());
  for (const auto& t : message.tensors()) {
    if (t.bytes() > 0) send(t.data, t.bytes());
  }
  return parts;
}

}  // namespace anview::patterns::rpc
