#include "anview/error.hpp"

#include <sstream>

namespace anview {
namespace {

std::string format(ErrorKind kind, const ErrorContext& c) {
  std::ostringstream out;
  out << "anview " << to_string(kind) << " error";
  if (c.rank >= 0) out << " on rank " << c.rank;
  if (c.peer >= 0) out << " with peer " << c.peer;
  if (!c.peer_address.empty()) out << " (" << c.peer_address << ")";
  if (!c.operation.empty()) out << " in " << c.operation;
  if (c.tag) out << " tag=" << *c.tag;
  if (!c.cause.empty()) out << ": " << c.cause;
  return out.str();
}

}  // namespace

const char* to_string(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::usage: return "usage";
    case ErrorKind::timeout: return "timeout";
    case ErrorKind::peer_lost: return "peer_lost";
    case ErrorKind::link: return "link";
    case ErrorKind::protocol: return "protocol";
    case ErrorKind::internal: return "internal";
    case ErrorKind::auth: return "auth";
    case ErrorKind::remote: return "remote";
  }
  return "unknown";
}

Error::Error(ErrorKind kind, ErrorContext context)
    : std::runtime_error(format(kind, context)), kind_(kind), context_(std::move(context)) {}

Error Error::for_operation(std::string operation, std::optional<std::uint64_t> tag) const {
  ErrorContext c = context_;
  if (c.operation != operation) {
    c.cause = c.operation.empty() ? c.cause : "earlier failure in " + c.operation + ": " + c.cause;
    c.operation = std::move(operation);
  }
  c.tag = tag;
  return Error(kind_, std::move(c));
}

}  // namespace anview
