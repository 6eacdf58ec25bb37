// anview::Message — what RPC calls, replies and pub/sub publications carry: bytes plus tensor
// attachments (dtype and shape), framed as in docs/rpc.md.
//
// A Message is a cheap value: copies share the memory it refers to. The bytes and every
// attachment are sent straight from that memory (no copy on the sending side); received ones
// land in buffers the Message owns. Memory given as a view (Message::view, add_tensor) must stay
// valid and untouched until the call, reply or publication using it has completed; keep_alive
// hands the Message a reference that keeps it so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "anview/collectives.hpp"

namespace anview {

// One tensor attachment: `shape` elements of `dtype` (row-major, contiguous) at `data`.
struct Tensor {
  DataType dtype = DataType::uint8;
  std::vector<std::int64_t> shape;
  const void* data = nullptr;

  std::size_t elements() const;
  std::size_t bytes() const { return elements() * size_of(dtype); }
};

class Message {
 public:
  Message() = default;
  // Copies the text or bytes into memory the Message owns.
  explicit Message(std::string_view text);
  explicit Message(std::span<const std::byte> bytes);
  // Takes the vector (no copy).
  explicit Message(std::vector<std::byte> bytes);
  // Refers to `bytes` bytes at `data` without copying them (see the lifetime rule above).
  static Message view(const void* data, std::size_t bytes);

  // Attaches a tensor by reference (no copy); `dtype` and `shape` are copied.
  Message& add_tensor(Tensor tensor);
  // Keeps `owner` alive as long as any copy of this Message (for views and tensors).
  Message& keep_alive(std::shared_ptr<const void> owner);

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  std::string_view text() const { return {reinterpret_cast<const char*>(data_), size_}; }
  std::size_t size() const { return size_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }
  // Bytes plus every attachment's bytes.
  std::size_t total_bytes() const;

 private:
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::vector<Tensor> tensors_;
  std::vector<std::shared_ptr<const void>> owners_;
};

}  // namespace anview
