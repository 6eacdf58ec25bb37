// The shared-memory ring as its consumer reads it (transport/shm/ring.hpp): the producer is
// another process and is not trusted, so any ring contents and any head must give either
// records that lie inside the ring or an error, never a read outside it.
// Input: a mode byte, then
//   mode 0 (hostile producer): capacity choice, head (u64), then the ring's bytes;
//   mode 1 (honest producer): records to write (kind, body length, fill byte) through
//          RingWriter, read back through RingReader in order and intact, with the consumer
//          freeing space as it goes.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "bootstrap/store_protocol.hpp"
#include "check.hpp"
#include "transport/shm/ring.hpp"

namespace shm = anview::transport::shm;
using anview::bootstrap::store_protocol::get_u64;

namespace {

struct Ring {
  explicit Ring(std::size_t capacity) : data(capacity) {
    control = new (&storage) shm::RingControl{};
    control->capacity = capacity;
    control->head.store(0);
    control->tail.store(0);
  }
  alignas(shm::cache_line) unsigned char storage[sizeof(shm::RingControl)];
  shm::RingControl* control;
  std::vector<char> data;  // exactly the ring: ASan sees any read past it
};

void hostile(const std::uint8_t* in, std::size_t size) {
  if (size < 9) return;
  Ring ring(std::size_t{256} << (in[0] % 4));
  const std::uint64_t head = get_u64(in + 1);
  std::memcpy(ring.data.data(), in + 9, std::min(size - 9, ring.data.size()));
  ring.control->head.store(head);
  shm::RingReader reader;
  reader.attach(ring.control, ring.data.data(), ring.data.size(), ring.control->flag_salt);
  // A record is read where its sequence number says it is due, else where `head` announces
  // it; either way it lies inside the ring, and each ring offset holds one sequence number, so
  // the reading ends within a lap.
  std::uint64_t records = 0;
  for (;;) {
    shm::RingReader::Record record;
    std::string error;
    if (!reader.peek(record, error)) break;
    const char* begin = ring.data.data();
    FUZZ_CHECK(record.body >= begin && record.body + record.bytes <= begin + ring.data.size());
    std::vector<char> copy(record.body, record.body + record.bytes);  // touches every byte
    reader.pop(record);
    FUZZ_CHECK(++records <= ring.data.size() / shm::record_align);
  }
}

void honest(const std::uint8_t* in, std::size_t size) {
  Ring ring(1024);
  shm::RingWriter writer;
  writer.attach(ring.control, ring.data.data(), ring.data.size());
  shm::RingReader reader;
  reader.attach(ring.control, ring.data.data(), ring.data.size(), ring.control->flag_salt);
  struct Sent {
    shm::RecordKind kind;
    std::size_t bytes;
    char fill;
  };
  std::vector<Sent> in_flight;
  auto drain = [&] {
    for (const Sent& sent : in_flight) {
      shm::RingReader::Record record;
      std::string error;
      FUZZ_CHECK(reader.peek(record, error));
      FUZZ_CHECK(record.kind == sent.kind && record.bytes == sent.bytes);
      for (std::size_t i = 0; i < record.bytes; ++i) FUZZ_CHECK(record.body[i] == sent.fill);
      reader.pop(record);
    }
    reader.publish();
    in_flight.clear();
    shm::RingReader::Record none;
    std::string error;
    FUZZ_CHECK(!reader.peek(none, error) && error.empty());
  };
  for (std::size_t at = 0; at + 3 <= size; at += 3) {
    // Records the consumer may see: every kind but pad, which only the writer makes.
    static constexpr shm::RecordKind kinds[] = {
        shm::RecordKind::frame, shm::RecordKind::fragment, shm::RecordKind::frame_ref,
        shm::RecordKind::ack,   shm::RecordKind::goodbye,  shm::RecordKind::push,
        shm::RecordKind::pushed};
    const Sent sent{kinds[in[at] % 7], in[at + 1] % (writer.max_body() + 1),
                    static_cast<char>(in[at + 2])};
    char* body = writer.reserve(sent.kind, sent.bytes);
    if (body == nullptr) {  // full: the consumer catches up, then it fits
      writer.publish();
      drain();
      body = writer.reserve(sent.kind, sent.bytes);
      FUZZ_CHECK(body != nullptr);
    }
    std::memset(body, sent.fill, sent.bytes);
    in_flight.push_back(sent);
    if (in[at] & 0x80) {
      writer.publish();
      drain();
    }
  }
  writer.publish();
  drain();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  if (data[0] & 1) {
    honest(data + 1, size - 1);
  } else {
    hostile(data + 1, size - 1);
  }
  return 0;
}
