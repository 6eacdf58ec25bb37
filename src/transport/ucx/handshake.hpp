// What UCX carries for Anview (docs/wire-protocol.md, "UCX"): every message is a UCP active
// message whose UCX header is one of the structs below; frame payloads are the active
// message's data (eager, or UCX's rendezvous into the landing buffer).
//
// Active messages do not say which endpoint they came on, so each names its sender's rank;
// ordered frames carry a per-pair sequence number, so a frame that UCX delivers early (another
// lane or protocol) waits for its turn instead of overtaking.
#pragma once

#include <cstdint>
#include <string>

#include "transport/frame.hpp"

namespace anview::transport::ucx {

// Active message ids (per worker).
enum AmId : unsigned { am_frame = 1, am_hello = 2, am_bye = 3 };

inline constexpr std::uint32_t hello_magic = 0x55564e41;  // "ANVU"
inline constexpr std::uint16_t protocol_version = 1;

struct AmHeader {
  FrameHeader frame;
  std::uint32_t source = 0;  // the sender's rank
  std::uint32_t flags = 0;   // ordered_flag
  std::uint64_t seq = 0;     // ordered frames: 0, 1, 2, ... per sender and receiver
};
static_assert(sizeof(AmHeader) == 48, "AmHeader is a wire format");
inline constexpr std::uint32_t ordered_flag = 1;

// The first message on every endpoint, before any frame.
struct Hello {
  std::uint32_t magic = hello_magic;
  std::uint16_t version = protocol_version;
  std::uint16_t reserved = 0;
  std::uint64_t job_id = 0;
  std::uint32_t rank = 0;
  std::uint32_t world_size = 0;
};
static_assert(sizeof(Hello) == 24, "Hello is a wire format");

// The last message: the sender closed its communicator (a later endpoint error is its leaving,
// not a failure); with close_magic, it closed its link to the receiver after a failure of its
// own (a timed-out transfer, a protocol error), which fails the link there too.
inline constexpr std::uint32_t close_magic = 0x43564e41;  // "ANVC"
struct Bye {
  std::uint32_t magic = hello_magic;
  std::uint32_t rank = 0;
};
static_assert(sizeof(Bye) == 8, "Bye is a wire format");

// PeerInfo::endpoints["ucx"]: "1:", the worker address in hex, ":", and in hex the address of
// a word holding transport::probe_value, by which a same-host peer tests cross-memory attach.
struct Endpoint {
  std::string worker_address;
  std::uint64_t probe_address = 0;
};
std::string encode_endpoint(const Endpoint& endpoint);
bool decode_endpoint(const std::string& text, Endpoint& endpoint, std::string* why);

// Empty when `hello` comes from another rank of this job speaking this protocol; else why not.
std::string check_hello(const Hello& hello, std::uint64_t job_id, int world_size, int self);

}  // namespace anview::transport::ucx
