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

// Whether freed request blocks are kept for reuse (not under AddressSanitizer).
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool requests_recycled = false;
#else
inline constexpr bool requests_recycled = true;
#endif

// Free blocks for one T each, per thread, at most `limit`; what a thread keeps goes back to
// std::allocator<T> when it exits.
template <class T>
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
      std::allocator<T>{}.deallocate(reinterpret_cast<T*>(n), 1);
    }
  }

 private:
  struct Node {
    Node* next;
  };
  static_assert(sizeof(T) >= sizeof(Node) && alignof(T) >= alignof(Node));
  static constexpr std::size_t limit = requests_recycled ? 64 : 0;
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
      if (void* p = BlockCache<T>::take()) return static_cast<T*>(p);
    }
    return std::allocator<T>{}.allocate(n);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (n == 1 && BlockCache<T>::give(p)) return;
    std::allocator<T>{}.deallocate(p, n);
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
