// The kernel's transparent huge page policy, for memory that asks for 2 MiB pages
// (anview::HostBuffer) and for the tools that say whether such memory gets them.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace anview::base {

// The bracketed word of /sys/kernel/mm/transparent_hugepage/enabled: "always", "madvise"
// (memory advised MADV_HUGEPAGE gets them) or "never"; "unavailable" when that file cannot be
// read (a kernel without them, or /sys masked in a container).
std::string huge_page_policy();

// The value `tunables` (GLIBC_TUNABLES: "name=value:name=value", null when unset) gives the
// tunable `name`, the last one where it is named twice; nullopt where it does not name it.
std::optional<std::string> glibc_tunable(const char* tunables, std::string_view name);

// The tunable under which glibc 2.35+ advises malloc's large blocks MADV_HUGEPAGE ("1").
inline constexpr std::string_view malloc_huge_pages_tunable = "glibc.malloc.hugetlb";

// Whether memory advised MADV_HUGEPAGE gets huge pages under `policy`.
inline bool advised_memory_gets_huge_pages(const std::string& policy) {
  return policy == "always" || policy == "madvise";
}

}  // namespace anview::base
