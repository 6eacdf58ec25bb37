// The memory regions this rank registered for one-sided access (one_sided.cpp), and the record
// of each that initiators with direct access (cross-memory attach) read before they touch the
// memory: a key whose record no longer matches names a region that is gone, and one whose
// record names another communicator is not this communicator's to use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

namespace anview::p2p {

// Read by other processes at its address: plain fields, the layout is fixed.
struct RegionRecord {
  std::uint64_t token = 0;  // 0: free
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
  std::uint64_t scope = 0;  // the communicator's job id: its ranks agree on it, others differ
};
static_assert(sizeof(RegionRecord) == 32, "RegionRecord is read across processes");

class RegionTable {
 public:
  // `salt` makes tokens differ between communicators (and runs); `scope` goes into every
  // record.
  RegionTable(std::uint64_t salt, std::uint64_t scope) : salt_(salt), scope_(scope) {}
  RegionTable(const RegionTable&) = delete;
  RegionTable& operator=(const RegionTable&) = delete;

  // Records live at a fixed address for the table's lifetime (freed ones are reused with a new
  // token), so a peer may read a record after its region is gone.
  const RegionRecord& add(const void* data, std::size_t bytes);
  bool remove(std::uint64_t token);
  const RegionRecord* find(std::uint64_t token) const;
  std::size_t size() const { return by_token_.size(); }

 private:
  std::uint64_t salt_;
  std::uint64_t scope_;
  std::uint64_t next_ = 0;
  std::deque<RegionRecord> records_;
  std::vector<RegionRecord*> free_;
  std::unordered_map<std::uint64_t, RegionRecord*> by_token_;
};

}  // namespace anview::p2p
