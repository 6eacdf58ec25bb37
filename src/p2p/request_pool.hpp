// Requests are allocated once per message; malloc and free of one (glibc, tcache hit) cost
// about 250 instructions, as much as matching and completing the message together. Freed
// request blocks go to a small list of the freeing thread and are handed out again by the
// next allocation on that thread, like UCX's request mpool.
//
// Under AddressSanitizer nothing is kept, so a use after free of a request is still caught.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>

#include "p2p/request_impl.hpp"

namespace anview::p2p {

// Free blocks of `Size` bytes, per thread, at most `limit`; what a thread keeps goes back to
// operator delete when it exits.
template <std::size_t Size, std::size_t Align>
class BlockCache {
 public:
  static void* take() noexcept {
    BlockCache& c = mine();
    Node* n = c.head_;
    if (n == nullptr) return nullptr;
    c.head_ = n->next;
    --c.count_;
    return n;
  }
  static bool give(void* block) noexcept {
    BlockCache& c = mine();
    if (c.count_ >= limit) return false;
    c.head_ = ::new (block) Node{c.head_};
    ++c.count_;
    return true;
  }
  ~BlockCache() {
    while (head_ != nullptr) {
      Node* n = std::exchange(head_, head_->next);
      ::operator delete (static_cast<void*>(n), Size, std::align_val_t{Align});
    }
  }

 private:
  struct Node {
    Node* next;
  };
  static_assert(Size >= sizeof(Node));
#if defined(__SANITIZE_ADDRESS__)
  static constexpr std::size_t limit = 0;
#else
  static constexpr std::size_t limit = 64;
#endif
  static BlockCache& mine() noexcept {
    thread_local BlockCache cache;
    return cache;
  }
  Node* head_ = nullptr;
  std::size_t count_ = 0;
};

template <class T>
struct RecyclingAllocator {
  using value_type = T;
  RecyclingAllocator() = default;
  template <class U>
  RecyclingAllocator(const RecyclingAllocator<U>&) noexcept {}

  T* allocate(std::size_t n) {
    if (n == 1) {
      if (void* p = BlockCache<sizeof(T), alignof(T)>::take()) return static_cast<T*>(p);
    }
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{alignof(T)}));
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (n == 1 && BlockCache<sizeof(T), alignof(T)>::give(p)) return;
    ::operator delete (static_cast<void*>(p), n * sizeof(T), std::align_val_t{alignof(T)});
  }
  template <class U>
  bool operator==(const RecyclingAllocator<U>&) const noexcept {
    return true;
  }
};

// std::make_shared<RequestImpl>, from recycled blocks.
template <class... Args>
std::shared_ptr<anview::detail::RequestImpl> new_request(Args&&... args) {
  return std::allocate_shared<anview::detail::RequestImpl>(
      RecyclingAllocator<anview::detail::RequestImpl>{}, std::forward<Args>(args)...);
}

}  // namespace anview::p2p
