// One direction of a shared-memory link: a single-producer single-consumer byte ring of
// variable-length records, in memory both processes map. Lock-free: the producer publishes
// with a release store of `head`, the consumer frees space with a release store of `tail`.
// Each side writes only its own cache lines (Seastar's SPSC queue layout), so the two cores do
// not fight over one line. Records never wrap: one that does not fit before the end of the ring
// is preceded by a pad record that skips to the start.
//
// Records are cache-line aligned, and a record's sequence number doubles as its "ready" flag
// (as a UCX FIFO element's owner bit does): the producer writes it last, with a release store,
// before it publishes `head`. The consumer finds the next record by looking at the line the
// record is in, so a small message costs it one cache-line transfer (header and payload
// together), not two dependent ones (`head`, then the record). `head` still counts: where the
// record's sequence number is not the one due, the consumer reads `head`, and a record it
// announces must be in place (else the ring is corrupt); sleeping decisions read `head` too.
//
// Where the next record will go, the ring may hold an older record's payload, and payload is
// anything: small integers are common, so a plain sequence number there could pass for the
// record due (the fuzzer found a payload byte 57 over zeroes where record 57 was due). So the
// field holds the number scrambled with the ring's salt (a random number the consumer picks
// when it sets the ring up): payload matches the value due by accident with odds of 2^-64.
// Clearing the field ahead of the consumer instead costs the consumer a cache-line transfer on
// every message (0.1 us per 8-byte round trip measured here).
//
// The other process is not trusted: everything read from the ring (record headers, lengths,
// sequence numbers) is checked before use, and a bad record fails the link, never the process.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace anview::transport::shm {

inline constexpr std::size_t cache_line = 64;

inline std::string to_hex(std::uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "%llx", static_cast<unsigned long long>(value));
  return text;
}
inline constexpr std::uint32_t ring_magic = 0x52564e41;  // "ANVR"
inline constexpr std::uint32_t ring_version = 3;

// Set by the consumer in RingControl::consumer_flags.
inline constexpr std::uint32_t consumer_reads_by_reference = 1;  // it can read our memory (CMA)

// The start of a ring slot. The consumer (the segment's owner) initialises it and then sets
// `ready`; the producer uses the ring only after it saw `ready`.
struct RingControl {
  alignas(cache_line) std::atomic<std::uint32_t> ready;  // 0 until the consumer attached
  std::uint32_t magic;
  std::uint32_t version;
  std::uint32_t consumer_flags;
  std::uint64_t capacity;                               // bytes of ring data, a power of two
  std::uint64_t flag_salt;                              // see record_flag()
  alignas(cache_line) std::atomic<std::uint64_t> head;  // producer: bytes published
  alignas(cache_line) std::atomic<std::uint64_t> tail;  // consumer: bytes consumed
  // Revoking memory offers. The consumer reads (frame_ref) and writes (push) memory the
  // producer offered through this ring: it counts itself in `consumer_accessing` around each
  // such access and gives up if `producer_closed` is set. A producer that closes sets the flag
  // and waits until the count is zero before it lets the offered buffers go.
  alignas(cache_line) std::atomic<std::uint32_t> producer_closed;
  std::atomic<std::uint32_t> consumer_accessing;
  // Why the producer closed: the rank whose loss made it give up the link, or -1.
  std::atomic<std::int32_t> close_cause;
};
static_assert(sizeof(RingControl) == 4 * cache_line);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
inline constexpr std::size_t ring_data_offset = 4096;  // data starts on its own page

enum class RecordKind : std::uint8_t {
  frame = 1,      // FrameHeader, then the first bytes of its payload (fragments follow)
  fragment = 2,   // more payload of the frame in assembly
  frame_ref = 3,  // FrameHeader + PayloadRef: the consumer reads the payload from our memory
  ack = 4,        // a PayloadRef's payload was read (8-byte cookie)
  goodbye = 5,    // the producer closed its communicator
  pad = 6,        // skip to the start of the ring
  push = 7,       // PushRequest: write this part of a frame_ref payload into our memory
  pushed = 8,     // the part asked for by a push was written (8-byte cookie)
};

inline constexpr std::uint16_t record_magic = 0xA5E1;

struct RecordHeader {
  std::uint16_t magic;
  RecordKind kind;
  std::uint8_t reserved;
  std::uint32_t bytes;  // record body bytes after this header
  std::uint64_t flag;   // record_flag(sequence number, salt); written last
};
static_assert(sizeof(RecordHeader) == 16);
inline constexpr std::size_t record_flag_offset = 8;

// Records are numbered from 1 per ring, pads included. The header holds the number multiplied
// by an odd constant (a bijection: every number has its own flag) and xor-ed with the salt.
inline std::uint64_t record_flag(std::uint64_t seq, std::uint64_t salt) {
  return seq * 0x9E3779B97F4A7C15ULL ^ salt;
}
// The flag field of the record header at `header`, as an atomic (the producer writes it while
// the consumer looks at it).
inline std::atomic_ref<std::uint64_t> record_flag_at(char* header) {
  return std::atomic_ref<std::uint64_t>(
      *reinterpret_cast<std::uint64_t*>(header + record_flag_offset));
}

struct PayloadRef {
  std::uint64_t address;  // in the producer's address space
  std::uint64_t cookie;   // echoed in push, pushed and ack
  std::uint64_t flags;    // ref_any_order
};
// The frame may complete after frames behind it (bulk data with its own offset), so the
// consumer may split its copy with the producer.
inline constexpr std::uint64_t ref_any_order = 1;

struct PushRequest {
  std::uint64_t cookie;
  std::uint64_t destination;  // in the consumer's address space
  std::uint64_t offset;       // into the payload
  std::uint64_t bytes;
};

// A cache line: a small record (a header, a frame header and up to 16 payload bytes) is one
// line, and the producer writing the next record does not touch the line being read. It also
// leaves a pad room for its header.
inline constexpr std::size_t record_align = cache_line;
inline constexpr std::size_t record_size(std::size_t body) {
  return (sizeof(RecordHeader) + body + record_align - 1) & ~(record_align - 1);
}

// The producer's view of a ring.
class RingWriter {
 public:
  // `capacity`: the size checked against what the handshake announced, not read again from
  // memory the peer can write.
  void attach(RingControl* control, char* data, std::size_t capacity) {
    control_ = control;
    data_ = data;
    capacity_ = capacity;
    salt_ = control->flag_salt;
    // A new ring (Connection::check_up() saw both at 0): not read again, the peer may have
    // written them since.
    head_ = 0;
    tail_ = 0;
    unpublished_.reserve(64);
  }
  bool attached() const { return control_ != nullptr; }
  std::size_t capacity() const { return capacity_; }
  // The largest record body one reservation may hold: a quarter of the ring, so a record
  // always fits once the consumer caught up.
  std::size_t max_body() const { return capacity_ / 4 - sizeof(RecordHeader); }

  // Room for one record with `body` bytes, or null when the ring is full now. The record is
  // invisible to the consumer until publish().
  char* reserve(RecordKind kind, std::size_t body) {
    const std::size_t size = record_size(body);
    const std::size_t offset = head_ & (capacity_ - 1);
    const std::size_t pad = offset + size > capacity_ ? capacity_ - offset : 0;
    if (!has_room(pad + size)) return nullptr;
    if (pad > 0) {
      write_header(offset, RecordKind::pad, pad - sizeof(RecordHeader));
      head_ += pad;
    }
    char* record = write_header(head_ & (capacity_ - 1), kind, body);
    head_ += size;
    return record + sizeof(RecordHeader);
  }
  // Makes every reserved record visible to the consumer: their flags, in order, then `head`.
  void publish() {
    // They are the last unpublished_.size() sequence numbers, in order.
    std::uint64_t seq = seq_ - unpublished_.size();
    for (const std::size_t offset : unpublished_)
      record_flag_at(data_ + offset).store(record_flag(++seq, salt_), std::memory_order_release);
    unpublished_.clear();
    control_->head.store(head_, std::memory_order_seq_cst);
  }

  // The consumer freed space since we last looked (for sleeping decisions).
  bool tail_moved() const { return control_->tail.load(std::memory_order_acquire) != tail_; }
  // The consumer's position as we last read it: where a reserve() that found no room saw it.
  std::uint64_t seen_tail() const { return tail_; }

 private:
  bool has_room(std::size_t bytes) {
    if (capacity_ - (head_ - tail_) >= bytes) return true;
    tail_ = control_->tail.load(std::memory_order_acquire);
    return capacity_ - (head_ - tail_) >= bytes;
  }
  // The header without its flag (the consumer may be looking at it; what is there is not the
  // flag due, and the one written now must not be seen before the record is complete);
  // publish() writes that.
  char* write_header(std::size_t offset, RecordKind kind, std::size_t body) {
    const RecordHeader h{record_magic, kind, 0, static_cast<std::uint32_t>(body), 0};
    char* header = data_ + offset;
    std::memcpy(header, &h, record_flag_offset);
    unpublished_.push_back(offset);
    ++seq_;
    return header;
  }

  std::vector<std::size_t> unpublished_;  // offsets of the records reserved since publish()
  RingControl* control_ = nullptr;
  char* data_ = nullptr;
  std::size_t capacity_ = 0;
  std::uint64_t head_ = 0;
  std::uint64_t tail_ = 0;  // last seen
  std::uint64_t seq_ = 0;
  std::uint64_t salt_ = 0;
};

// The consumer's view of a ring.
class RingReader {
 public:
  struct Record {
    RecordKind kind;
    const char* body;
    std::size_t bytes;
  };

  // `capacity` and `salt`: what this side wrote into the control block (the peer can write
  // there too; they are not read back).
  void attach(RingControl* control, char* data, std::size_t capacity, std::uint64_t salt) {
    control_ = control;
    data_ = data;
    capacity_ = capacity;
    salt_ = salt;
    tail_ = control->tail.load(std::memory_order_relaxed);
  }
  bool attached() const { return control_ != nullptr; }
  std::size_t capacity() const { return capacity_; }

  // True when the producer published records we have not consumed: the next record is in
  // place, or `head` says there is one (seq_cst: pairs with the sleeping flag, see
  // ShmTransport::before_sleep).
  bool has_data() const {
    return next_arrived() || ahead(control_->head.load(std::memory_order_seq_cst));
  }
  // The record due next announced itself (its sequence number is in place; acquire: so is
  // the rest of it). Cheaper than has_data() (no look at `head`, which the producer writes on
  // every publish), but without its ordering against the sleeping flag.
  bool next_arrived() const {
    return record_flag_at(data_ + (tail_ & (capacity_ - 1))).load(std::memory_order_acquire) ==
           record_flag(seq_ + 1, salt_);
  }

  // The next record (pads skipped), or false when there is none. A record that is not valid
  // sets `error` and returns false; the ring must not be read again.
  // `announced_only`: only a record whose sequence number is in place, `head` unread (a
  // consumer that just read a record looks for another without the cache line `head` is in;
  // a record `head` announces is still found, and checked, by the next plain call).
  bool peek(Record& out, std::string& error, bool announced_only = false) {
    for (;;) {
      const std::size_t offset = tail_ & (capacity_ - 1);
      // The bytes the record may span: to the ring's end when it announced itself, else what
      // `head` says was published (the record must then be in place).
      std::uint64_t available = capacity_ - offset;
      if (!next_arrived()) {
        if (announced_only) return false;
        const std::uint64_t head = control_->head.load(std::memory_order_acquire);
        if (!ahead(head)) return false;
        if (head - tail_ > capacity_ || head - tail_ < sizeof(RecordHeader) ||
            offset + sizeof(RecordHeader) > capacity_) {
          error = "head " + std::to_string(head) + " is inconsistent with tail " +
                  std::to_string(tail_) + " (capacity " + std::to_string(capacity_) + ")";
          return false;
        }
        available = std::min<std::uint64_t>(available, head - tail_);
      }
      RecordHeader h;
      std::memcpy(&h, data_ + offset, sizeof h);
      const std::size_t size = record_size(h.bytes);
      if (h.magic != record_magic || h.reserved != 0 || h.kind < RecordKind::frame ||
          h.kind > RecordKind::pushed) {
        error = "bad record header at offset " + std::to_string(offset) + " (magic 0x" +
                to_hex(h.magic) + ", kind " + std::to_string(static_cast<int>(h.kind)) + ")";
        return false;
      }
      if (h.flag != record_flag(seq_ + 1, salt_)) {
        error = "record flag 0x" + to_hex(h.flag) + " where record " + std::to_string(seq_ + 1) +
                " (0x" + to_hex(record_flag(seq_ + 1, salt_)) + ") was due";
        return false;
      }
      if (h.bytes > capacity_ || size > available) {
        error = "record of " + std::to_string(h.bytes) + " bytes at offset " +
                std::to_string(offset) + " runs past the ring or past the published data";
        return false;
      }
      if (h.kind == RecordKind::pad) {
        if (offset + size != capacity_) {
          error = "pad record at offset " + std::to_string(offset) + " does not end the ring";
          return false;
        }
        ++seq_;
        tail_ += size;
        continue;
      }
      out = Record{h.kind, data_ + offset + sizeof(RecordHeader), h.bytes};
      return true;
    }
  }
  // Consumes the record peek() returned; publish() frees the space for the producer.
  void pop(const Record& record) {
    ++seq_;
    tail_ += record_size(record.bytes);
  }
  void publish() { control_->tail.store(tail_, std::memory_order_seq_cst); }

 private:
  // `head` announces records we have not read. It may also lag behind `tail_` for a moment:
  // we read records as they announce themselves, the producer stores `head` after.
  bool ahead(std::uint64_t head) const { return static_cast<std::int64_t>(head - tail_) > 0; }

  RingControl* control_ = nullptr;
  char* data_ = nullptr;
  std::size_t capacity_ = 0;
  std::uint64_t tail_ = 0;
  std::uint64_t seq_ = 0;
  std::uint64_t salt_ = 0;
};

}  // namespace anview::transport::shm
