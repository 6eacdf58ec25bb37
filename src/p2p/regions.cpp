#include "p2p/regions.hpp"

namespace anview::p2p {

const RegionRecord& RegionTable::add(const void* data, std::size_t bytes) {
  // Multiplying the counter by an odd constant is a bijection: tokens never repeat within the
  // table, and the salt keeps another table's tokens from matching.
  std::uint64_t token = 0;
  while (token == 0) token = salt_ ^ (++next_ * 0x9E3779B97F4A7C15ull);
  RegionRecord* record = nullptr;
  if (!free_.empty()) {
    record = free_.back();
    free_.pop_back();
  } else {
    record = &records_.emplace_back();
  }
  record->address = reinterpret_cast<std::uint64_t>(data);
  record->bytes = bytes;
  record->scope = scope_;
  record->token = token;
  by_token_.emplace(token, record);
  return *record;
}

bool RegionTable::remove(std::uint64_t token) {
  auto it = by_token_.find(token);
  if (it == by_token_.end()) return false;
  RegionRecord* record = it->second;
  record->token = 0;  // first: a peer reading the record from now on finds no match
  record->address = 0;
  record->bytes = 0;
  by_token_.erase(it);
  free_.push_back(record);
  return true;
}

const RegionRecord* RegionTable::find(std::uint64_t token) const {
  auto it = by_token_.find(token);
  return it == by_token_.end() ? nullptr : it->second;
}

}  // namespace anview::p2p
