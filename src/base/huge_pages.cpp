#include "base/huge_pages.hpp"

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

}  // namespace anview::base
