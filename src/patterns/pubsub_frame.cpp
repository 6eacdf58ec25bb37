#include "patterns/pubsub_frame.hpp"

#include <cstring>

namespace anview::patterns::pubsub {
namespace {

template <typename T>
void put(std::vector<std::byte>& out, T value) {
  const auto at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &value, sizeof(T));  // little-endian hosts only
}

template <typename T>
T get(const std::byte* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

void put_header(std::vector<std::byte>& out, Kind kind, std::uint32_t count, std::uint64_t value) {
  put<std::uint32_t>(out, frame_magic);
  put<std::uint8_t>(out, frame_version);
  put<std::uint8_t>(out, static_cast<std::uint8_t>(kind));
  put<std::uint16_t>(out, 0);
  put<std::uint32_t>(out, count);
  put<std::uint32_t>(out, 0);
  put<std::uint64_t>(out, value);
}

bool fail(std::string& why, std::string text) {
  why = std::move(text);
  return false;
}

}  // namespace

std::vector<std::byte> encode_subscribe(const Subscription& s) {
  std::vector<std::byte> out;
  put_header(out, Kind::subscribe, static_cast<std::uint32_t>(s.topics.size()), s.window_bytes);
  put<std::uint8_t>(out, static_cast<std::uint8_t>(s.policy));
  put<std::uint8_t>(out, 0);
  put<std::uint16_t>(out, 0);
  put<std::uint32_t>(out, s.window);
  put<std::uint32_t>(out, s.queue_limit);
  put<std::uint32_t>(out, 0);
  for (const auto& t : s.topics) {
    put<std::uint16_t>(out, static_cast<std::uint16_t>(t.size()));
    const auto at = out.size();
    out.resize(at + t.size());
    if (!t.empty()) std::memcpy(out.data() + at, t.data(), t.size());
  }
  return out;
}

std::vector<std::byte> encode_credit(std::uint32_t messages, std::uint64_t bytes) {
  std::vector<std::byte> out;
  put_header(out, Kind::credit, messages, bytes);
  return out;
}

std::vector<std::byte> encode_end(std::uint64_t last_sequence) {
  std::vector<std::byte> out;
  put_header(out, Kind::end, 0, last_sequence);
  return out;
}

void BatchWriter::clear() {
  buffer_.clear();
  put_header(buffer_, Kind::batch, 0, 0);
  entries_ = 0;
}

void BatchWriter::add(std::uint64_t sequence, std::string_view topic,
                      std::span<const std::byte> payload, bool apart) {
  const auto at = buffer_.size();
  buffer_.resize(at + entry_size(topic, apart ? 0 : payload.size()));
  std::byte* p = buffer_.data() + at;
  const std::uint8_t flags = apart ? 1 : 0;
  const auto topic_bytes = static_cast<std::uint16_t>(topic.size());
  const auto payload_bytes = static_cast<std::uint32_t>(payload.size());
  std::memcpy(p, &sequence, 8);
  std::memcpy(p + 8, &flags, 1);
  std::memset(p + 9, 0, 1);
  std::memcpy(p + 10, &topic_bytes, 2);
  std::memcpy(p + 12, &payload_bytes, 4);
  if (!topic.empty()) std::memcpy(p + entry_bytes, topic.data(), topic.size());
  if (!apart && !payload.empty())
    std::memcpy(p + entry_bytes + topic.size(), payload.data(), payload.size());
  ++entries_;
}

std::span<const std::byte> BatchWriter::frame() {
  std::memcpy(buffer_.data() + 8, &entries_, 4);
  return buffer_;
}

bool parse_header(std::span<const std::byte> bytes, Header& out, std::string& why) {
  if (bytes.size() < header_bytes)
    return fail(why, "frame of " + std::to_string(bytes.size()) + " bytes, shorter than its " +
                         std::to_string(header_bytes) + "-byte header");
  const std::byte* p = bytes.data();
  if (get<std::uint32_t>(p) != frame_magic) return fail(why, "not a pub/sub frame (bad magic)");
  if (get<std::uint8_t>(p + 4) != frame_version)
    return fail(why, "pub/sub frame version " + std::to_string(get<std::uint8_t>(p + 4)) +
                         ", this side speaks " + std::to_string(frame_version));
  const auto kind = get<std::uint8_t>(p + 5);
  if (kind < 1 || kind > 4) return fail(why, "unknown frame kind " + std::to_string(kind));
  if (get<std::uint16_t>(p + 6) != 0 || get<std::uint32_t>(p + 12) != 0)
    return fail(why, "reserved header bytes are not zero");
  out.kind = static_cast<Kind>(kind);
  out.count = get<std::uint32_t>(p + 8);
  out.value = get<std::uint64_t>(p + 16);
  if ((out.kind == Kind::credit || out.kind == Kind::end) && bytes.size() != header_bytes)
    return fail(why, std::to_string(bytes.size() - header_bytes) + " stray bytes after the frame");
  return true;
}

bool parse_subscribe(std::span<const std::byte> bytes, Subscription& out, std::string& why) {
  Header h;
  if (!parse_header(bytes, h, why)) return false;
  if (h.kind != Kind::subscribe) return fail(why, "expected a subscribe frame");
  if (bytes.size() < header_bytes + subscribe_fixed_bytes)
    return fail(why, "subscribe frame ends inside its fields");
  const std::byte* p = bytes.data() + header_bytes;
  const auto policy = get<std::uint8_t>(p);
  if (policy > 1) return fail(why, "unknown back-pressure policy " + std::to_string(policy));
  if (get<std::uint8_t>(p + 1) != 0 || get<std::uint16_t>(p + 2) != 0 ||
      get<std::uint32_t>(p + 12) != 0)
    return fail(why, "reserved subscribe bytes are not zero");
  out.policy = static_cast<Backpressure>(policy);
  out.window = get<std::uint32_t>(p + 4);
  out.queue_limit = get<std::uint32_t>(p + 8);
  out.window_bytes = h.value;
  if (out.window == 0 || out.window_bytes == 0)
    return fail(why, "a window of 0 messages or 0 bytes");
  if (h.count == 0 || h.count > max_topics)
    return fail(why, std::to_string(h.count) + " topics (1 to " + std::to_string(max_topics) + ")");
  std::size_t at = header_bytes + subscribe_fixed_bytes;
  out.topics.clear();
  for (std::uint32_t i = 0; i < h.count; ++i) {
    if (bytes.size() - at < 2) return fail(why, "frame ends inside topic " + std::to_string(i));
    const auto len = get<std::uint16_t>(bytes.data() + at);
    at += 2;
    if (len > max_topic_bytes)
      return fail(why, "topic of " + std::to_string(len) + " bytes (limit " +
                           std::to_string(max_topic_bytes) + ")");
    if (bytes.size() - at < len) return fail(why, "frame ends inside topic " + std::to_string(i));
    out.topics.emplace_back(reinterpret_cast<const char*>(bytes.data() + at), len);
    at += len;
  }
  if (at != bytes.size())
    return fail(why, std::to_string(bytes.size() - at) + " stray bytes after the topics");
  return true;
}

bool parse_batch(std::span<const std::byte> bytes, std::size_t max_message_bytes,
                 std::vector<Entry>& out, std::string& why) {
  out.clear();
  Header h;
  if (!parse_header(bytes, h, why)) return false;
  if (h.kind != Kind::batch) return fail(why, "expected a batch frame");
  if (h.value != 0) return fail(why, "reserved batch field is not zero");
  // Each entry takes at least entry_bytes: a count the frame cannot hold is refused first.
  if (h.count > (bytes.size() - header_bytes) / entry_bytes)
    return fail(why, std::to_string(h.count) + " entries in a frame of " +
                         std::to_string(bytes.size()) + " bytes");
  out.reserve(h.count);
  std::size_t at = header_bytes;
  for (std::uint32_t i = 0; i < h.count; ++i) {
    if (bytes.size() - at < entry_bytes)
      return fail(why, "frame ends inside entry " + std::to_string(i));
    const std::byte* p = bytes.data() + at;
    Entry e;
    e.sequence = get<std::uint64_t>(p);
    const auto flags = get<std::uint8_t>(p + 8);
    if (flags > 1 || get<std::uint8_t>(p + 9) != 0)
      return fail(why, "entry " + std::to_string(i) + " has unknown flags");
    e.apart = flags == 1;
    const auto topic_bytes = get<std::uint16_t>(p + 10);
    e.payload_bytes = get<std::uint32_t>(p + 12);
    if (topic_bytes > max_topic_bytes)
      return fail(why, "entry " + std::to_string(i) + " has a topic of " +
                           std::to_string(topic_bytes) + " bytes");
    if (e.payload_bytes > max_message_bytes)
      return fail(why, "entry " + std::to_string(i) + " has a payload of " +
                           std::to_string(e.payload_bytes) + " bytes (limit " +
                           std::to_string(max_message_bytes) + ")");
    at += entry_bytes;
    const std::size_t inline_bytes = e.apart ? 0 : e.payload_bytes;
    if (bytes.size() - at < topic_bytes + inline_bytes)
      return fail(why, "frame ends inside entry " + std::to_string(i));
    e.topic = {reinterpret_cast<const char*>(bytes.data() + at), topic_bytes};
    at += topic_bytes;
    if (!e.apart) e.inline_payload = bytes.subspan(at, inline_bytes);
    at += inline_bytes;
    out.push_back(e);
  }
  if (at != bytes.size())
    return fail(why, std::to_string(bytes.size() - at) + " stray bytes after the entries");
  return true;
}

}  // namespace anview::patterns::pubsub
