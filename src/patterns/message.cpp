#include "anview/message.hpp"

#include <cstring>

namespace anview {

std::size_t Tensor::elements() const {
  std::size_t n = 1;
  for (auto d : shape) n *= d > 0 ? static_cast<std::size_t>(d) : 0;
  return n;
}

Message::Message(std::string_view text)
    : Message(std::span<const std::byte>(reinterpret_cast<const std::byte*>(text.data()),
                                         text.size())) {}

Message::Message(std::span<const std::byte> bytes)
    : Message(std::vector<std::byte>(bytes.begin(), bytes.end())) {}

Message::Message(std::vector<std::byte> bytes) {
  auto owned = std::make_shared<std::vector<std::byte>>(std::move(bytes));
  data_ = owned->data();
  size_ = owned->size();
  owners_.push_back(std::move(owned));
}

Message Message::view(const void* data, std::size_t bytes) {
  Message m;
  m.data_ = static_cast<const std::byte*>(data);
  m.size_ = bytes;
  return m;
}

Message& Message::add_tensor(Tensor tensor) {
  tensors_.push_back(std::move(tensor));
  return *this;
}

Message& Message::keep_alive(std::shared_ptr<const void> owner) {
  owners_.push_back(std::move(owner));
  return *this;
}

std::size_t Message::total_bytes() const {
  std::size_t total = size_;
  for (const auto& t : tensors_) total += t.bytes();
  return total;
}

}  // namespace anview
