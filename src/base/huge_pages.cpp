#include "base/huge_pages.hpp"

#include <algorithm>
#include <fstream>

namespace anview::base {

std::string huge_page_policy() {
  // "always [madvise] never": the bracketed word is the policy.
  std::ifstream file("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!file || !std::getline(file, line)) return "unavailable";
  const auto open = line.find('[');
  const auto close = line.find(']', open);
  if (open == std::string::npos || close == std::string::npos) return "unavailable";
  return line.substr(open + 1, close - open - 1);
}

std::optional<std::string> glibc_tunable(const char* tunables, std::string_view name) {
  const std::string_view all = tunables != nullptr ? tunables : "";
  std::optional<std::string> value;
  for (std::size_t at = 0; at <= all.size();) {
    const std::size_t end = std::min(all.find(':', at), all.size());
    const std::string_view entry = all.substr(at, end - at);
    const std::size_t equals = entry.find('=');
    if (entry.substr(0, equals) == name)
      value = equals == std::string_view::npos ? "" : std::string(entry.substr(equals + 1));
    at = end + 1;
  }
  return value;
}

}  // namespace anview::base
