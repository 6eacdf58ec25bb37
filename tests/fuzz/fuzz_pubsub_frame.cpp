// The pub/sub frames as a publisher (subscribe, credit) and a subscriber (batch, end) parse
// them (docs/pubsub.md). Input: one byte choosing the message limit (64 KiB or 4 KiB), then
// the bytes of one message. A frame the parsers accept respects the limits and encodes back
// to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "check.hpp"
#include "patterns/pubsub_frame.hpp"

namespace ps = anview::patterns::pubsub;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::size_t limit = (data[0] & 1) ? 65536 : 4096;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  ps::Header header;
  std::string why;
  if (!ps::parse_header(bytes, header, why)) {
    FUZZ_CHECK(!why.empty());
    return 0;
  }
  std::vector<std::byte> again;
  if (header.kind == ps::Kind::credit) {
    again = ps::encode_credit(header.count, header.value);
  } else if (header.kind == ps::Kind::end) {
    FUZZ_CHECK(header.count == 0 || bytes.size() == ps::header_bytes);
    if (header.count != 0) return 0;
    again = ps::encode_end(header.value);
  } else if (header.kind == ps::Kind::subscribe) {
    ps::Subscription s;
    if (!ps::parse_subscribe(bytes, s, why)) {
      FUZZ_CHECK(!why.empty());
      return 0;
    }
    FUZZ_CHECK(!s.topics.empty() && s.topics.size() <= ps::max_topics);
    for (const auto& t : s.topics) FUZZ_CHECK(t.size() <= ps::max_topic_bytes);
    again = ps::encode_subscribe(s);
  } else {
    std::vector<ps::Entry> entries;
    if (!ps::parse_batch(bytes, limit, entries, why)) {
      FUZZ_CHECK(!why.empty());
      return 0;
    }
    ps::BatchWriter writer;
    std::size_t apart_total = 0, apart_count = 0;
    for (const auto& e : entries) {
      FUZZ_CHECK(e.topic.size() <= ps::max_topic_bytes);
      // What a subscriber allocates for it (a larger one it skips).
      FUZZ_CHECK(e.too_large == (e.payload_bytes > limit));
      if (e.apart && !e.too_large) {
        apart_total += e.payload_bytes;  // and for all of them, when it takes the batch
        FUZZ_CHECK(++apart_count == 1 || apart_total <= ps::apart_bytes_per_batch);
      }
      if (e.apart) {
        writer.add_apart(e.sequence, e.topic, e.payload_bytes);
      } else {
        FUZZ_CHECK(e.inline_payload.size() == e.payload_bytes);
        writer.add(e.sequence, e.topic, e.inline_payload, false);
      }
    }
    const auto frame = writer.frame();
    again.assign(frame.begin(), frame.end());
  }
  FUZZ_CHECK(again.size() == bytes.size());
  FUZZ_CHECK(std::memcmp(again.data(), bytes.data(), bytes.size()) == 0);
  return 0;
}
