// The kernel's transparent huge page policy, for memory that asks for 2 MiB pages
// (anview::HostBuffer) and for the tools that say whether such memory gets them.
#pragma once

#include <string>

namespace anview::base {

// The bracketed word of /sys/kernel/mm/transparent_hugepage/enabled: "always", "madvise"
// (memory advised MADV_HUGEPAGE gets them) or "never"; "unavailable" when that file cannot be
// read (a kernel without them, or /sys masked in a container).
std::string huge_page_policy();

// Whether memory advised MADV_HUGEPAGE gets huge pages under `policy`.
inline bool advised_memory_gets_huge_pages(const std::string& policy) {
  return policy == "always" || policy == "madvise";
}

}  // namespace anview::base
