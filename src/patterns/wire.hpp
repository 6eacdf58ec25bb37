// Reading and writing the fixed-width little-endian fields of the patterns' frames (rpc_frame,
// pubsub_frame; little-endian hosts only, as docs/wire-protocol.md says), and the parsers' way
// of refusing a frame.
#pragma once

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

namespace anview::patterns::wire {

// Writes `value` at `at` and moves past it.
template <typename T>
void store(std::byte*& at, T value) {
  std::memcpy(at, &value, sizeof(T));
  at += sizeof(T);
}

// Appends `value` to `out`.
template <typename T>
void append(std::vector<std::byte>& out, T value) {
  const auto at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &value, sizeof(T));
}

template <typename T>
T load(const std::byte* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

// Says why a frame is refused; returns false for the parser to return.
inline bool refuse(std::string& why, std::string text) {
  why = std::move(text);
  return false;
}

}  // namespace anview::patterns::wire
