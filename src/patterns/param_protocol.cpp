#include "patterns/param_protocol.hpp"

#include <charconv>

namespace anview::patterns::param {

std::string ring_text(std::uint64_t epoch, const HashRing& ring) {
  std::string out = std::to_string(epoch) + " " + std::to_string(ring.virtual_nodes()) + "\n";
  for (const auto& s : ring.servers()) out += s + "\n";
  return out;
}

std::vector<std::string_view> lines(std::string_view text) {
  std::vector<std::string_view> out;
  while (!text.empty()) {
    const auto nl = text.find('\n');
    out.push_back(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return out;
}

std::optional<std::uint64_t> number(std::string_view text) {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

std::optional<RingState> parse_ring(std::string_view text) {
  const auto ls = lines(text);
  if (ls.empty()) return std::nullopt;
  const auto space = ls[0].find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  const auto epoch = number(ls[0].substr(0, space));
  const auto vnodes = number(ls[0].substr(space + 1));
  if (!epoch || !vnodes || *vnodes < 1 || *vnodes > 65536) return std::nullopt;
  std::vector<std::string> servers;
  for (std::size_t i = 1; i < ls.size(); ++i) {
    if (ls[i].empty()) return std::nullopt;
    servers.emplace_back(ls[i]);
  }
  return RingState{*epoch, HashRing(std::move(servers), static_cast<int>(*vnodes))};
}

}  // namespace anview::patterns::param
