#include "transport/ucx/handshake.hpp"

#include <charconv>
#include <span>

#include "base/auth.hpp"

namespace anview::transport::ucx {
namespace {

constexpr std::size_t max_address_bytes = 64 * 1024;

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

std::string encode_endpoint(const Endpoint& endpoint) {
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(endpoint.worker_address.data());
  char probe[17];
  const auto end = std::to_chars(probe, probe + sizeof probe, endpoint.probe_address, 16).ptr;
  return std::to_string(protocol_version) + ":" +
         base::auth::to_hex(std::span(bytes, endpoint.worker_address.size())) + ":" +
         std::string(probe, end);
}

bool decode_endpoint(const std::string& text, Endpoint& endpoint, std::string* why) {
  auto fail = [why](std::string cause) {
    if (why) *why = std::move(cause);
    return false;
  };
  const auto colon = text.find(':');
  if (colon == std::string::npos) return fail("its ucx endpoint is malformed (no version)");
  if (text.substr(0, colon) != std::to_string(protocol_version)) {
    return fail("it speaks UCX endpoint version " + text.substr(0, colon) + ", this rank " +
                std::to_string(protocol_version));
  }
  const auto second = text.find(':', colon + 1);
  if (second == std::string::npos) return fail("its ucx endpoint is malformed (no probe)");
  const std::size_t digits = second - colon - 1;
  if (digits == 0 || digits % 2 != 0 || digits / 2 > max_address_bytes)
    return fail("its UCX worker address is malformed (" + std::to_string(digits) + " hex digits)");
  std::string address;
  address.reserve(digits / 2);
  for (std::size_t i = colon + 1; i < second; i += 2) {
    const int hi = hex_value(text[i]), lo = hex_value(text[i + 1]);
    if (hi < 0 || lo < 0) return fail("its UCX worker address is not hex");
    address += static_cast<char>(hi << 4 | lo);
  }
  std::uint64_t probe = 0;
  const char* first = text.data() + second + 1;
  const char* last = text.data() + text.size();
  const auto [end, ec] = std::from_chars(first, last, probe, 16);
  if (ec != std::errc() || end != last || first == last)
    return fail("its ucx endpoint's probe address is not hex");
  endpoint.worker_address = std::move(address);
  endpoint.probe_address = probe;
  return true;
}

std::string check_hello(const Hello& hello, std::uint64_t job_id, int world_size, int self) {
  if (hello.magic != hello_magic) return "not an Anview hello (bad magic)";
  if (hello.version != protocol_version) {
    return "protocol version " + std::to_string(hello.version) + ", this rank speaks " +
           std::to_string(protocol_version);
  }
  if (hello.job_id != job_id) return "it belongs to another job";
  if (hello.world_size != static_cast<std::uint32_t>(world_size)) {
    return "its job has " + std::to_string(hello.world_size) + " ranks, ours " +
           std::to_string(world_size);
  }
  if (hello.rank >= static_cast<std::uint32_t>(world_size) ||
      hello.rank == static_cast<std::uint32_t>(self))
    return "it claims rank " + std::to_string(hello.rank);
  return {};
}

}  // namespace anview::transport::ucx
