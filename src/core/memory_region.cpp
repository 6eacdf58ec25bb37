// The public one-sided API: RemoteKey's byte form, MemoryRegion, and the Communicator calls.
#include <cstring>

#include "anview/communicator.hpp"
#include "anview/memory.hpp"
#include "core/communicator_impl.hpp"

namespace anview {
namespace {

constexpr std::uint32_t key_magic = 0x314B5641;  // "AVK1"

template <typename T>
void put_field(std::byte*& at, T value) {
  std::memcpy(at, &value, sizeof value);
  at += sizeof value;
}

template <typename T>
T take_field(const std::byte*& at) {
  T value;
  std::memcpy(&value, at, sizeof value);
  at += sizeof value;
  return value;
}

}  // namespace

std::array<std::byte, RemoteKey::packed_bytes> RemoteKey::pack() const {
  std::array<std::byte, packed_bytes> out{};
  std::byte* at = out.data();
  put_field(at, key_magic);
  put_field(at, static_cast<std::int32_t>(rank));
  put_field(at, token);
  put_field(at, address);
  put_field(at, bytes);
  put_field(at, record);
  put_field(at, pid);
  put_field(at, fd);
  return out;
}

RemoteKey RemoteKey::unpack(std::span<const std::byte> data) {
  auto bad = [&](const std::string& cause) {
    return Error(ErrorKind::usage, {.operation = "unpack key", .cause = cause});
  };
  if (data.size() != packed_bytes) {
    throw bad(std::to_string(data.size()) + " bytes are not a packed key (" +
              std::to_string(packed_bytes) + " bytes)");
  }
  const std::byte* at = data.data();
  if (take_field<std::uint32_t>(at) != key_magic) throw bad("not a packed key (bad magic)");
  RemoteKey key;
  key.rank = take_field<std::int32_t>(at);
  key.token = take_field<std::uint64_t>(at);
  key.address = take_field<std::uint64_t>(at);
  key.bytes = take_field<std::uint64_t>(at);
  key.record = take_field<std::uint64_t>(at);
  key.pid = take_field<std::int32_t>(at);
  key.fd = take_field<std::int32_t>(at);
  if (key.rank < 0 || key.token == 0) throw bad("a packed key with no region in it");
  return key;
}

MemoryRegion::MemoryRegion(MemoryRegion&& other) noexcept
    : messenger_(std::move(other.messenger_)), key_(other.key_) {
  other.key_ = {};
}

MemoryRegion& MemoryRegion::operator=(MemoryRegion&& other) noexcept {
  if (this != &other) {
    deregister();
    messenger_ = std::move(other.messenger_);
    key_ = other.key_;
    other.key_ = {};
  }
  return *this;
}

MemoryRegion::~MemoryRegion() {
  deregister();
}

void MemoryRegion::deregister() {
  if (messenger_) messenger_->deregister_memory(key_.token);
  messenger_.reset();
  key_ = {};
}

MemoryRegion Communicator::register_memory(void* data, std::size_t bytes) {
  auto& messenger = impl_->messenger();
  return MemoryRegion(messenger.shared_from_this(), messenger.register_memory(data, bytes));
}

MemoryRegion Communicator::allocate_memory(std::size_t bytes) {
  auto& messenger = impl_->messenger();
  return MemoryRegion(messenger.shared_from_this(), messenger.allocate_memory(bytes));
}

Request Communicator::put(const void* local, std::size_t bytes, const RemoteKey& key,
                          std::uint64_t offset) {
  return Request(impl_->messenger().put(local, bytes, key, offset));
}

Request Communicator::get(void* local, std::size_t bytes, const RemoteKey& key,
                          std::uint64_t offset) {
  return Request(impl_->messenger().get(local, bytes, key, offset));
}

Request Communicator::flush(int peer) {
  return Request(impl_->messenger().flush(peer));
}

}  // namespace anview
