#include "transport/shm/handshake.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <iterator>
#include <sstream>

#include "base/socket.hpp"

namespace anview::transport::shm {
namespace {

bool parse_number(const std::string& text, int base, std::uint64_t& out) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, out, base);
  return ec == std::errc() && ptr == end && !text.empty();
}

}  // namespace

std::string encode_endpoint(const Endpoint& e) {
  std::ostringstream out;
  out << "v" << segment_version << " pid=" << e.pid << " fd=" << e.segment_fd
      << " ring=" << e.ring_bytes << " wake=" << e.wake_name << " probe=" << std::hex
      << e.probe_address;
  return out.str();
}

bool decode_endpoint(const std::string& text, Endpoint& out, std::string* why) {
  std::istringstream in(text);
  std::string word;
  std::string version = "v";  // built by appending: GCC 12 -O3 warns about "v" + string
  version += std::to_string(segment_version);
  if (!(in >> word) || word != version) {
    if (why) {
      *why = "its shm endpoint has layout version '";
      *why += word;
      *why += "', this build speaks ";
      *why += version;
    }
    return false;
  }
  Endpoint e;
  // The five fields each once: one repeated must not stand in for one missing (a missing ring
  // size would leave the ring's capacity 0, and a writer's offsets unmasked).
  static constexpr const char* required[] = {"pid", "fd", "ring", "wake", "probe"};
  unsigned seen = 0;
  while (in >> word) {
    const auto eq = word.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = word.substr(0, eq);
    const std::string value = word.substr(eq + 1);
    std::uint64_t number = 0;
    bool ok = true;
    if (key == "pid") {
      ok = parse_number(value, 10, number) && number > 0 && number < (1u << 31);
      e.pid = static_cast<int>(number);
    } else if (key == "fd") {
      ok = parse_number(value, 10, number) && number < (1u << 31);
      e.segment_fd = static_cast<int>(number);
    } else if (key == "ring") {
      ok = parse_number(value, 10, number) && number >= 4096 && number <= (1ull << 30) &&
           (number & (number - 1)) == 0;
      e.ring_bytes = number;
    } else if (key == "wake") {
      ok = !value.empty() && value.size() < 100;
      e.wake_name = value;
    } else if (key == "probe") {
      ok = parse_number(value, 16, number);
      e.probe_address = number;
    } else {
      continue;  // a newer minor field
    }
    if (!ok) {
      if (why) *why = "its shm endpoint has a bad '" + key + "' field: '" + value + "'";
      return false;
    }
    unsigned bit = 0;
    while (key != required[bit]) ++bit;  // one of them: other keys were skipped above
    if ((seen & (1u << bit)) != 0) {
      if (why) *why = "its shm endpoint repeats the '" + key + "' field: '" + text + "'";
      return false;
    }
    seen |= 1u << bit;
  }
  if (seen != (1u << std::size(required)) - 1) {
    if (why) *why = "its shm endpoint lacks fields: '" + text + "'";
    return false;
  }
  out = e;
  return true;
}

Mapping& Mapping::operator=(Mapping&& other) noexcept {
  if (this != &other) {
    if (address_) ::munmap(address_, bytes_);
    address_ = other.address_;
    bytes_ = other.bytes_;
    other.address_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

Mapping::~Mapping() {
  if (address_) ::munmap(address_, bytes_);
}

Mapping map_shared(int fd, std::size_t offset, std::size_t bytes, std::string* why, bool writable) {
  void* p = ::mmap(nullptr, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd,
                   static_cast<off_t>(offset));
  if (p == MAP_FAILED) {
    if (why)
      *why = "mmap of " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
             ": " + base::errno_text(errno);
    return {};
  }
  return Mapping(p, bytes);
}

int open_peer_segment(int pid, int fd, std::string* why) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  const int opened = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (opened < 0 && why) {
    *why = "cannot open its segment " + path + ": " + base::errno_text(errno) +
           " (processes in different containers or pid namespaces? then use "
           "ANVIEW_TRANSPORTS=tcp, or give each container its own ANVIEW_HOST_ID)";
  }
  return opened;
}

}  // namespace anview::transport::shm
