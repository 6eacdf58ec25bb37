// The pub/sub frames (docs/pubsub.md): subscribe and credit (subscriber to publisher, tag 1),
// batches of messages and the end of the stream (publisher to subscriber, tag 2; payloads
// sent apart follow on tag 3). Encoded and parsed here only; the parsers check every length and
// count against limits before use and say what is wrong with a frame they refuse.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "anview/pubsub.hpp"
#include "anview/types.hpp"

namespace anview::patterns::pubsub {

inline constexpr std::uint32_t frame_magic = 0x53505641;  // "AVPS" on the wire
inline constexpr std::uint8_t frame_version = 1;
inline constexpr std::size_t header_bytes = 24;
inline constexpr std::size_t subscribe_fixed_bytes = 16;
inline constexpr std::size_t entry_bytes = 16;
inline constexpr std::size_t max_topics = 64;
inline constexpr std::size_t max_topic_bytes = 256;
// The longest subscribe frame: every topic its longest, each after its 2-byte length.
inline constexpr std::size_t max_subscribe_bytes =
    header_bytes + subscribe_fixed_bytes + max_topics * (2 + max_topic_bytes);
// A batch frame is at most this long (the subscriber's receive buffer); payloads above
// inline_limit are sent apart.
inline constexpr std::size_t batch_capacity = 64 * 1024;
inline constexpr std::size_t inline_limit = 4096;
// The payloads a batch sends apart total at most this, unless it sends one alone: a batch's
// payloads travel by rendezvous all at once, and thousands of them outstanding slow the
// transport down (1 MiB messages: 0.25 GB/s in batches of thousands, 14 GB/s in batches of
// four). The subscriber allocates them when it takes the batch, so it refuses a batch over it.
inline constexpr std::size_t apart_bytes_per_batch = 4 << 20;

inline constexpr Tag control_tag{1};  // subscriber -> publisher
inline constexpr Tag batch_tag{2};    // publisher -> subscriber
inline constexpr Tag payload_tag{3};  // publisher -> subscriber, payloads sent apart

enum class Kind : std::uint8_t { subscribe = 1, credit = 2, batch = 3, end = 4 };

struct Header {
  Kind kind = Kind::batch;
  std::uint32_t count = 0;  // topics, credited messages, or batch entries
  std::uint64_t value = 0;  // window bytes, credited bytes, or the last sequence (end)
};

struct Subscription {
  Backpressure policy = Backpressure::block;
  std::uint32_t window = 0;
  std::uint64_t window_bytes = 0;
  std::uint32_t queue_limit = 0;
  std::vector<std::string> topics;
};

struct Entry {
  std::uint64_t sequence = 0;
  bool apart = false;  // the payload follows as a message of its own
  std::string_view topic;
  std::uint32_t payload_bytes = 0;
  std::span<const std::byte> inline_payload;  // when not apart
  bool too_large = false;  // over the subscriber's max_message_bytes: it skips the message
};

std::vector<std::byte> encode_subscribe(const Subscription& s);
std::vector<std::byte> encode_credit(std::uint32_t messages, std::uint64_t bytes);
std::vector<std::byte> encode_end(std::uint64_t last_sequence);

// Builds one batch frame in place; entries can be dropped from the front (drop-oldest).
class BatchWriter {
 public:
  BatchWriter() { clear(); }
  void clear();
  // Entries in the frame (added and not dropped).
  std::size_t entries() const { return offsets_.size() - first_; }
  // Entries dropped from the front so far: entry i of add() order is live if i >= dropped().
  std::size_t dropped() const { return first_; }
  void drop_front() { ++first_; }
  // The bytes adding this entry would take.
  static std::size_t entry_size(std::string_view topic, std::size_t inline_bytes) {
    return entry_bytes + topic.size() + inline_bytes;
  }
  // Bytes the writer holds (dropped entries included, until clear).
  std::size_t size() const { return buffer_.size(); }
  // `payload` is copied when inline (not apart).
  void add(std::uint64_t sequence, std::string_view topic, std::span<const std::byte> payload,
           bool apart);
  // An entry whose payload of `bytes` is sent apart (only its size goes in the frame).
  void add_apart(std::uint64_t sequence, std::string_view topic, std::uint32_t bytes);
  // The finished frame of the live entries (valid until the next add, drop or clear).
  std::span<const std::byte> frame();

 private:
  // Appends an entry's fixed part and topic; returns where an inline payload goes.
  std::byte* start_entry(std::uint64_t sequence, std::string_view topic, bool apart,
                         std::uint32_t bytes);
  std::vector<std::byte> buffer_;
  std::vector<std::size_t> offsets_;  // where each added entry starts
  std::size_t first_ = 0;             // the first live entry
};

bool parse_header(std::span<const std::byte> bytes, Header& out, std::string& why);
bool parse_subscribe(std::span<const std::byte> bytes, Subscription& out, std::string& why);
// The entries of a batch frame; a payload over max_message_bytes marks its entry too_large (the
// publisher does not know the subscriber's limit). Payloads sent apart, other than those, must
// together be at most apart_bytes_per_batch where there are several.
bool parse_batch(std::span<const std::byte> bytes, std::size_t max_message_bytes,
                 std::vector<Entry>& out, std::string& why);

}  // namespace anview::patterns::pubsub
