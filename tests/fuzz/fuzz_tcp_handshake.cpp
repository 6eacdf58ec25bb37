// The TCP handshake as the listening side checks it (docs/wire-protocol.md, "Handshake"):
// a hello against what this rank expects, its path fields, and a reject's explanation. Input:
// 16 bytes of expectation (job id, world size, our rank below it, stream count, whether we
// have a secret), then the bytes a peer sent: the first 32 are what every version shares, the rest
// (to 88) only a version-3 peer sends; what is missing keeps its default, as on the wire.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "bootstrap/store_protocol.hpp"
#include "check.hpp"
#include "transport/tcp/handshake.hpp"

namespace tcp = anview::transport::tcp;
using anview::bootstrap::store_protocol::get_u16;
using anview::bootstrap::store_protocol::get_u32;
using anview::bootstrap::store_protocol::get_u64;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 16) return 0;
  const tcp::HandshakeExpectation expected{
      .job_id = get_u64(data) % 4,  // small: the fuzzer finds matching ids
      .world_size = 1 + get_u32(data + 8) % 4096,
      .my_rank = get_u16(data + 12) % (1 + get_u32(data + 8) % 4096),  // below the world size
      .stream_count = static_cast<std::uint16_t>(data[14] % 65),
      .has_secret = (data[15] & 1) != 0};
  data += 16;
  size -= 16;
  tcp::Handshake hello;
  std::memcpy(static_cast<void*>(&hello), data, std::min(size, sizeof hello));

  bool foreign = false;
  std::string why;
  const tcp::RejectReason reason = tcp::check_hello(hello, expected, &foreign, &why);
  FUZZ_CHECK(tcp::to_string(reason) != nullptr);
  if (reason == tcp::RejectReason::none) {
    FUZZ_CHECK(!foreign && why.empty());
    FUZZ_CHECK(hello.magic == tcp::handshake_magic && hello.version == tcp::protocol_version);
    FUZZ_CHECK(hello.kind == tcp::HandshakeKind::hello);
    FUZZ_CHECK(hello.job_id == expected.job_id && hello.world_size == expected.world_size);
    FUZZ_CHECK(hello.rank < expected.my_rank && hello.rank < hello.world_size);
    FUZZ_CHECK(hello.stream < hello.stream_count && hello.stream_count == expected.stream_count);
    FUZZ_CHECK((hello.auth != 0) == expected.has_secret);
    const tcp::PathFields path = tcp::path_fields(hello);
    FUZZ_CHECK(path.path < path.path_count && path.path_count < 128);
  } else {
    FUZZ_CHECK(!why.empty());
  }
  // Path fields survive being written back (what the ack echoes).
  const tcp::PathFields fields = tcp::path_fields(hello);
  FUZZ_CHECK(fields.path_count >= 1 && fields.path_count < 128);
  tcp::Handshake echo;
  tcp::set_path_fields(echo, fields);
  const tcp::PathFields back = tcp::path_fields(echo);
  FUZZ_CHECK(back.path == fields.path && back.path_count == fields.path_count &&
             back.grants_credit == fields.grants_credit && back.generation == fields.generation);
  // A reject as the connecting side explains it.
  const std::string text = tcp::explain_reject(hello, static_cast<int>(hello.rank % 4097));
  FUZZ_CHECK(text.rfind("rank ", 0) == 0);
  return 0;
}
