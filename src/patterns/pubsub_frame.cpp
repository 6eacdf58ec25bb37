#include "patterns/pubsub_frame.hpp"

#include <cstring>

#include "patterns/wire.hpp"

namespace anview::patterns::pubsub {
namespace {

using wire::load;
using wire::refuse;
using wire::store;

void put_header(std::vector<std::byte>& out, Kind kind, std::uint32_t count, std::uint64_t value) {
  wire::append<std::uint32_t>(out, frame_magic);
  wire::append<std::uint8_t>(out, frame_version);
  wire::append<std::uint8_t>(out, static_cast<std::uint8_t>(kind));
  wire::append<std::uint16_t>(out, 0);
  wire::append<std::uint32_t>(out, count);
  wire::append<std::uint32_t>(out, 0);
  wire::append<std::uint64_t>(out, value);
}

}  // namespace

std::vector<std::byte> encode_subscribe(const Subscription& s) {
  std::vector<std::byte> out;
  put_header(out, Kind::subscribe, static_cast<std::uint32_t>(s.topics.size()), s.window_bytes);
  wire::append<std::uint8_t>(out, static_cast<std::uint8_t>(s.policy));
  wire::append<std::uint8_t>(out, 0);
  wire::append<std::uint16_t>(out, 0);
  wire::append<std::uint32_t>(out, s.window);
  wire::append<std::uint32_t>(out, s.queue_limit);
  wire::append<std::uint32_t>(out, 0);
  for (const auto& t : s.topics) {
    wire::append<std::uint16_t>(out, static_cast<std::uint16_t>(t.size()));
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
  offsets_.clear();
  first_ = 0;
}

std::byte* BatchWriter::start_entry(std::uint64_t sequence, std::string_view topic, bool apart,
                                    std::uint32_t bytes) {
  const auto at = buffer_.size();
  offsets_.push_back(at);
  buffer_.resize(at + entry_size(topic, apart ? 0 : bytes));
  std::byte* p = buffer_.data() + at;
  store<std::uint64_t>(p, sequence);
  store<std::uint8_t>(p, apart ? 1 : 0);
  store<std::uint8_t>(p, 0);
  store<std::uint16_t>(p, static_cast<std::uint16_t>(topic.size()));
  store<std::uint32_t>(p, bytes);
  if (!topic.empty()) std::memcpy(p, topic.data(), topic.size());
  return p + topic.size();
}

void BatchWriter::add_apart(std::uint64_t sequence, std::string_view topic, std::uint32_t bytes) {
  start_entry(sequence, topic, true, bytes);
}

void BatchWriter::add(std::uint64_t sequence, std::string_view topic,
                      std::span<const std::byte> payload, bool apart) {
  std::byte* inline_at =
      start_entry(sequence, topic, apart, static_cast<std::uint32_t>(payload.size()));
  if (!apart && !payload.empty()) std::memcpy(inline_at, payload.data(), payload.size());
}

std::span<const std::byte> BatchWriter::frame() {
  // The header goes right before the first live entry: over the dropped ones (each entry is at
  // least entry_bytes, so there is always room: the original header or dead entries).
  const std::size_t start = first_ < offsets_.size() ? offsets_[first_] : buffer_.size();
  std::vector<std::byte> header;
  put_header(header, Kind::batch, static_cast<std::uint32_t>(entries()), 0);
  std::memcpy(buffer_.data() + start - header_bytes, header.data(), header_bytes);
  return std::span<const std::byte>(buffer_).subspan(start - header_bytes);
}

bool parse_header(std::span<const std::byte> bytes, Header& out, std::string& why) {
  if (bytes.size() < header_bytes)
    return refuse(why, "frame of " + std::to_string(bytes.size()) + " bytes, shorter than its " +
                           std::to_string(header_bytes) + "-byte header");
  const std::byte* p = bytes.data();
  if (load<std::uint32_t>(p) != frame_magic) return refuse(why, "not a pub/sub frame (bad magic)");
  if (load<std::uint8_t>(p + 4) != frame_version)
    return refuse(why, "pub/sub frame version " + std::to_string(load<std::uint8_t>(p + 4)) +
                           ", this side speaks " + std::to_string(frame_version));
  const auto kind = load<std::uint8_t>(p + 5);
  if (kind < 1 || kind > 4) return refuse(why, "unknown frame kind " + std::to_string(kind));
  if (load<std::uint16_t>(p + 6) != 0 || load<std::uint32_t>(p + 12) != 0)
    return refuse(why, "reserved header bytes are not zero");
  out.kind = static_cast<Kind>(kind);
  out.count = load<std::uint32_t>(p + 8);
  out.value = load<std::uint64_t>(p + 16);
  if ((out.kind == Kind::credit || out.kind == Kind::end) && bytes.size() != header_bytes)
    return refuse(why,
                  std::to_string(bytes.size() - header_bytes) + " stray bytes after the frame");
  return true;
}

bool parse_subscribe(std::span<const std::byte> bytes, Subscription& out, std::string& why) {
  Header h;
  if (!parse_header(bytes, h, why)) return false;
  if (h.kind != Kind::subscribe) return refuse(why, "expected a subscribe frame");
  if (bytes.size() < header_bytes + subscribe_fixed_bytes)
    return refuse(why, "subscribe frame ends inside its fields");
  const std::byte* p = bytes.data() + header_bytes;
  const auto policy = load<std::uint8_t>(p);
  if (policy > 1) return refuse(why, "unknown back-pressure policy " + std::to_string(policy));
  if (load<std::uint8_t>(p + 1) != 0 || load<std::uint16_t>(p + 2) != 0 ||
      load<std::uint32_t>(p + 12) != 0)
    return refuse(why, "reserved subscribe bytes are not zero");
  out.policy = static_cast<Backpressure>(policy);
  out.window = load<std::uint32_t>(p + 4);
  out.queue_limit = load<std::uint32_t>(p + 8);
  out.window_bytes = h.value;
  if (out.window == 0 || out.window_bytes == 0 || out.queue_limit == 0)
    return refuse(why, "a window of 0 messages or 0 bytes, or a queue limit of 0");
  if (h.count == 0 || h.count > max_topics)
    return refuse(why,
                  std::to_string(h.count) + " topics (1 to " + std::to_string(max_topics) + ")");
  std::size_t at = header_bytes + subscribe_fixed_bytes;
  out.topics.clear();
  for (std::uint32_t i = 0; i < h.count; ++i) {
    if (bytes.size() - at < 2) return refuse(why, "frame ends inside topic " + std::to_string(i));
    const auto len = load<std::uint16_t>(bytes.data() + at);
    at += 2;
    if (len > max_topic_bytes)
      return refuse(why, "topic of " + std::to_string(len) + " bytes (limit " +
                             std::to_string(max_topic_bytes) + ")");
    if (bytes.size() - at < len) return refuse(why, "frame ends inside topic " + std::to_string(i));
    out.topics.emplace_back(reinterpret_cast<const char*>(bytes.data() + at), len);
    at += len;
  }
  if (at != bytes.size())
    return refuse(why, std::to_string(bytes.size() - at) + " stray bytes after the topics");
  return true;
}

bool parse_batch(std::span<const std::byte> bytes, std::size_t max_message_bytes,
                 std::vector<Entry>& out, std::string& why) {
  out.clear();
  Header h;
  if (!parse_header(bytes, h, why)) return false;
  if (h.kind != Kind::batch) return refuse(why, "expected a batch frame");
  if (h.value != 0) return refuse(why, "reserved batch field is not zero");
  // Each entry takes at least entry_bytes: a count the frame cannot hold is refused first.
  if (h.count > (bytes.size() - header_bytes) / entry_bytes)
    return refuse(why, std::to_string(h.count) + " entries in a frame of " +
                           std::to_string(bytes.size()) + " bytes");
  out.reserve(h.count);
  std::size_t at = header_bytes;
  std::size_t apart_total = 0, apart_count = 0;
  for (std::uint32_t i = 0; i < h.count; ++i) {
    if (bytes.size() - at < entry_bytes)
      return refuse(why, "frame ends inside entry " + std::to_string(i));
    const std::byte* p = bytes.data() + at;
    Entry e;
    e.sequence = load<std::uint64_t>(p);
    const auto flags = load<std::uint8_t>(p + 8);
    if (flags > 1 || load<std::uint8_t>(p + 9) != 0)
      return refuse(why, "entry " + std::to_string(i) + " has unknown flags");
    e.apart = flags == 1;
    const auto topic_bytes = load<std::uint16_t>(p + 10);
    e.payload_bytes = load<std::uint32_t>(p + 12);
    if (topic_bytes > max_topic_bytes)
      return refuse(why, "entry " + std::to_string(i) + " has a topic of " +
                             std::to_string(topic_bytes) + " bytes");
    e.too_large = e.payload_bytes > max_message_bytes;
    if (e.apart && !e.too_large) {
      apart_total += e.payload_bytes;
      if (++apart_count > 1 && apart_total > apart_bytes_per_batch)
        return refuse(why, "entries 0 to " + std::to_string(i) + " send " +
                               std::to_string(apart_total) + " payload bytes apart (limit " +
                               std::to_string(apart_bytes_per_batch) + " in a batch of several)");
    }
    at += entry_bytes;
    const std::size_t inline_bytes = e.apart ? 0 : e.payload_bytes;
    if (bytes.size() - at < topic_bytes + inline_bytes)
      return refuse(why, "frame ends inside entry " + std::to_string(i));
    e.topic = {reinterpret_cast<const char*>(bytes.data() + at), topic_bytes};
    at += topic_bytes;
    if (!e.apart) e.inline_payload = bytes.subspan(at, inline_bytes);
    at += inline_bytes;
    out.push_back(e);
  }
  if (at != bytes.size())
    return refuse(why, std::to_string(bytes.size() - at) + " stray bytes after the entries");
  return true;
}

}  // namespace anview::patterns::pubsub
