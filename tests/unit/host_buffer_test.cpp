// anview::HostBuffer: 2 MiB-aligned, zeroed memory advised for huge pages where the kernel's
// policy allows, owned like a unique_ptr.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "anview/error.hpp"
#include "anview/host_buffer.hpp"

namespace {

constexpr std::size_t huge_page = std::size_t{2} << 20;

// The VmFlags line of the mapping of /proc/self/smaps that holds `address`; empty if none.
std::string vm_flags_of(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto a = reinterpret_cast<std::uintptr_t>(address);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    std::uintptr_t start = 0, end = 0;
    char dash = 0;
    // A mapping's first line: "7f00...-7f00... rw-p ..."; its fields are "Name: value".
    if (line.find(':') > line.find(' ') &&
        std::sscanf(line.c_str(), "%" SCNxPTR "%c%" SCNxPTR, &start, &dash, &end) == 3 &&
        dash == '-') {
      inside = start <= a && a < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

// Whether the 4 KiB page at `address` is mapped (mincore fails with ENOMEM where it is not).
bool page_mapped(const void* address) {
  unsigned char resident = 0;
  return ::mincore(const_cast<void*>(address), 4096, &resident) == 0 || errno != ENOMEM;
}

// Whether any 4 KiB page of [address, address + bytes) is still mapped.
bool any_page_mapped(const void* address, std::size_t bytes) {
  for (std::size_t at = 0; at < bytes; at += 4096)
    if (page_mapped(static_cast<const char*>(address) + at)) return true;
  return false;
}

TEST(HostBuffer, NoBytesIsAnEmptyBuffer) {
  anview::HostBuffer empty(0);
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_FALSE(empty.huge_pages());
  anview::HostBuffer defaulted;
  EXPECT_TRUE(defaulted.empty());
}

TEST(HostBuffer, IsZeroedAlignedToTwoMebibytesAndWritable) {
  const std::size_t bytes = 3 * huge_page + 5;  // not a whole number of pages
  anview::HostBuffer buf(bytes);
  ASSERT_NE(buf.data(), nullptr);
  EXPECT_EQ(buf.size(), bytes);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buf.data()) % huge_page, 0u);
  const auto* bytes_in = static_cast<const unsigned char*>(buf.data());
  std::size_t nonzero = 0;
  for (std::size_t i = 0; i < bytes; ++i) nonzero += bytes_in[i] != 0;
  EXPECT_EQ(nonzero, 0u);
  std::memset(buf.data(), 0xA5, bytes);
  EXPECT_EQ(static_cast<unsigned char*>(buf.data())[bytes - 1], 0xA5);
}

TEST(HostBuffer, AsksForHugePagesWhereTheKernelsPolicyAllowsThem) {
  const std::string policy = anview::HostBuffer::huge_page_policy();
  ASSERT_TRUE(policy == "always" || policy == "madvise" || policy == "never" ||
              policy == "unavailable")
      << policy;
  anview::HostBuffer buf(4 * huge_page);
  EXPECT_EQ(buf.huge_pages(), policy == "always" || policy == "madvise") << policy;
  const std::string flags = vm_flags_of(buf.data());
  ASSERT_NE(flags, "") << "no mapping in /proc/self/smaps holds the buffer";
  // "hg": the mapping is advised MADV_HUGEPAGE (what the kernel backs with 2 MiB pages under
  // "madvise"); a kernel without transparent huge pages refuses the advice.
  if (policy != "unavailable") {
    EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
  }
}

TEST(HostBuffer, ASizePastTheAddressSpaceIsAUsageError) {
  try {
    anview::HostBuffer buf(SIZE_MAX);
    FAIL() << "a buffer of SIZE_MAX bytes was made";
  } catch (const anview::Error& e) {
    EXPECT_EQ(e.kind(), anview::ErrorKind::usage) << e.what();
    EXPECT_EQ(e.operation(), "host_buffer");
  }
}

// The freed ranges are checked page by page. A thread that another test of this binary left
// running could map memory into one first: a rare false failure, not a missed leak.
TEST(HostBuffer, MovingHandsOverTheMemoryAndDestroyingFreesIt) {
  const std::size_t bytes = huge_page + 5;  // two 2 MiB pages, the second barely used
  anview::HostBuffer a(bytes);
  void* const data = a.data();
  static_cast<char*>(data)[0] = 7;
  anview::HostBuffer b(std::move(a));
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(b.size(), bytes);
  anview::HostBuffer c(bytes);
  void* const replaced = c.data();
  c = std::move(b);
  EXPECT_EQ(c.data(), data);
  EXPECT_EQ(static_cast<char*>(c.data())[0], 7);
  EXPECT_FALSE(any_page_mapped(replaced, 2 * huge_page)) << "c's earlier buffer was not freed";
  c = anview::HostBuffer();
  EXPECT_FALSE(any_page_mapped(data, 2 * huge_page)) << "the moved buffer was not freed";
}

}  // namespace
