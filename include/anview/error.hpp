// anview::Error — the one exception type Anview throws.
//
// Every failure names its kind (what it breaks), this rank, the peer, the operation, the tag
// where there is one, and the cause. Kinds are grouped by blast radius:
//   usage      — the caller passed something wrong; nothing else is affected.
//   timeout    — a blocking call ran past its deadline; the operation may still be pending.
//   peer_lost  — a peer process is gone; every request involving it fails with this root cause.
//   link       — a connection broke or could not be made; the peer may still be alive.
//   protocol   — bytes from the wire (or the store) broke the protocol: garbage, a foreign
//                program, a version or job mismatch, a frame over the limits.
//   internal   — a system call failed in a way none of the above explains.
//   auth       — a connection did not prove the job secret (ANVIEW_SECRET), or this rank
//                could not: a wrong or missing secret, a replayed handshake (SECURITY.md).
//   remote     — the peer served the request and refused it: an RPC to an unknown method, or a
//                handler that raised (the cause is its message); or its part of a collective
//                failed (the cause says how); the connection is fine.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace anview {

enum class ErrorKind : std::uint8_t {
  usage,
  timeout,
  peer_lost,
  link,
  protocol,
  internal,
  auth,
  remote
};

const char* to_string(ErrorKind kind) noexcept;

// The context that makes an error actionable. Unknown fields stay at their defaults and are
// left out of the message.
struct ErrorContext {
  int rank = -1;             // this process's rank, -1 before it is known
  int peer = -1;             // the peer rank involved, -1 for none
  std::string peer_address;  // host:port of the peer where known
  std::string operation;     // "send", "recv", "connect", "store.get", ...
  std::optional<std::uint64_t> tag;
  std::string cause;  // the exact cause: syscall and errno text, the bad field and its value
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, ErrorContext context);

  ErrorKind kind() const noexcept { return kind_; }
  const ErrorContext& context() const noexcept { return context_; }
  int rank() const noexcept { return context_.rank; }
  int peer() const noexcept { return context_.peer; }
  const std::string& operation() const noexcept { return context_.operation; }
  const std::string& cause() const noexcept { return context_.cause; }

  // The same root cause re-raised for another operation (sticky failures): keeps kind, peer and
  // cause, and says which operation it now fails.
  Error for_operation(std::string operation, std::optional<std::uint64_t> tag) const;

 private:
  ErrorKind kind_;
  ErrorContext context_;
};

}  // namespace anview
