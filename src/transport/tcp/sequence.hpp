// Sequence numbers of the multi-path layer (docs/wire-protocol.md, "Multi-path"). Every frame a
// rank sends to a peer carries one: ordered frames count 1, 2, 3, ... in their own space;
// data chunks count in a second space marked by the top bit. The receiver remembers which
// numbers it has taken, so a frame sent again after a path failed is recognised and dropped.
// Private to transport/tcp.
#pragma once

#include <cstdint>
#include <set>

namespace anview::transport::tcp {

inline constexpr std::uint64_t chunk_seq_bit = std::uint64_t{1} << 63;
inline bool is_chunk_seq(std::uint64_t seq) {
  return (seq & chunk_seq_bit) != 0;
}

// A set of sequence numbers 1, 2, 3, ... kept as a floor (every number up to it is in) and the
// members above it; numbers usually arrive in order, so the set above stays small or empty.
class SeqSet {
 public:
  bool contains(std::uint64_t n) const { return n <= floor_ || above_.count(n) != 0; }
  void insert(std::uint64_t n) {
    if (n == floor_ + 1) {
      ++floor_;
      while (!above_.empty() && *above_.begin() == floor_ + 1) {
        above_.erase(above_.begin());
        ++floor_;
      }
    } else if (n > floor_) {
      above_.insert(n);
    }
  }
  std::uint64_t floor() const { return floor_; }  // every number <= floor is in the set
  std::size_t above_floor() const { return above_.size(); }

 private:
  std::uint64_t floor_ = 0;
  std::set<std::uint64_t> above_;
};

}  // namespace anview::transport::tcp
