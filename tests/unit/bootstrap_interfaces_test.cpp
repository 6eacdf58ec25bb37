// Interface listing and the choice of addresses a rank publishes.
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "anview/error.hpp"
#include "bootstrap/interfaces.hpp"

namespace anview::bootstrap {
namespace {

using Strings = std::vector<std::string>;

// A host with loopback, two Ethernet ports (eth1 down), an InfiniBand port, and a port with
// only a link-local address.
std::vector<Interface> fake_host() {
  return {
      {.name = "lo", .address = "127.0.0.1", .family = AF_INET, .up = true, .loopback = true},
      {.name = "lo", .address = "::1", .family = AF_INET6, .up = true, .loopback = true},
      {.name = "eth0", .address = "10.0.0.2", .family = AF_INET, .up = true},
      {.name = "eth0", .address = "fe80::2", .family = AF_INET6, .up = true, .link_local = true},
      {.name = "eth0", .address = "fd00::2", .family = AF_INET6, .up = true},
      {.name = "eth1", .address = "10.1.0.2", .family = AF_INET, .up = false},
      {.name = "ib0", .address = "192.168.5.2", .family = AF_INET, .up = true},
      {.name = "usb0", .address = "169.254.3.4", .family = AF_INET, .up = true, .link_local = true},
  };
}

void expect_usage_naming(const Strings& wanted, const std::string& needle) {
  try {
    const auto got = select_addresses(fake_host(), wanted, false);
    ADD_FAILURE() << "expected a usage Error, got " << got.size() << " addresses";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::usage) << e.what();
    EXPECT_NE(e.cause().find(needle), std::string::npos) << e.what();
  }
}

TEST(Interfaces, LoopbackSkippedUnlessRequested) {
  EXPECT_EQ(select_addresses(fake_host(), {}, false),
            (Strings{"10.0.0.2", "fd00::2", "192.168.5.2"}));
  // Requested: kept, after the others.
  EXPECT_EQ(select_addresses(fake_host(), {}, true),
            (Strings{"10.0.0.2", "fd00::2", "192.168.5.2", "127.0.0.1", "::1"}));
  // Naming it in the wanted list requests it too.
  EXPECT_EQ(select_addresses(fake_host(), {"lo"}, false), (Strings{"127.0.0.1", "::1"}));
}

TEST(Interfaces, DownAndLinkLocalSkipped) {
  const auto got = select_addresses(fake_host(), {}, true);
  EXPECT_EQ(std::count(got.begin(), got.end(), "10.1.0.2"), 0);     // eth1 is down
  EXPECT_EQ(std::count(got.begin(), got.end(), "fe80::2"), 0);      // link-local
  EXPECT_EQ(std::count(got.begin(), got.end(), "169.254.3.4"), 0);  // link-local
}

TEST(Interfaces, OrderFollowsWanted) {
  EXPECT_EQ(select_addresses(fake_host(), {"ib0", "eth0"}, false),
            (Strings{"192.168.5.2", "10.0.0.2", "fd00::2"}));
  EXPECT_EQ(select_addresses(fake_host(), {"eth0", "ib0"}, false),
            (Strings{"10.0.0.2", "fd00::2", "192.168.5.2"}));
  EXPECT_EQ(select_addresses(fake_host(), {"ib0", "ib0"}, false), (Strings{"192.168.5.2"}));
}

TEST(Interfaces, UnknownDownOrLinkLocalOnlyWantedNamesAreUsageErrors) {
  expect_usage_naming({"eth0", "wlan7"}, "'wlan7'");
  expect_usage_naming({"eth1"}, "'eth1' is down");
  expect_usage_naming({"usb0"}, "'usb0'");
}

TEST(Interfaces, ListThisHost) {
  const auto all = list_interfaces();
  // Every Linux host has a loopback interface with 127.0.0.1 (containers included).
  const auto lo = std::find_if(all.begin(), all.end(), [](const Interface& i) {
    return i.loopback && i.address == "127.0.0.1";
  });
  ASSERT_NE(lo, all.end());
  EXPECT_EQ(lo->family, AF_INET);
  EXPECT_TRUE(lo->up);
  EXPECT_FALSE(lo->link_local);
  for (const auto& i : all) {
    EXPECT_FALSE(i.name.empty());
    EXPECT_TRUE(i.family == AF_INET || i.family == AF_INET6);
    if (i.address.rfind("fe80:", 0) == 0 || i.address.rfind("169.254.", 0) == 0) {
      EXPECT_TRUE(i.link_local) << i.address;
    }
  }
  const auto mine = select_addresses(all, {lo->name}, false);
  EXPECT_NE(std::find(mine.begin(), mine.end(), "127.0.0.1"), mine.end());
}

TEST(Interfaces, WantedInterfacesFromTheSetting) {
  ::unsetenv("ANVIEW_IFACES");
  EXPECT_TRUE(wanted_interfaces().empty());
  ::setenv("ANVIEW_IFACES", " ib0, eth0,,", 1);
  EXPECT_EQ(wanted_interfaces(), (Strings{"ib0", "eth0"}));
  ::unsetenv("ANVIEW_IFACES");
}

TEST(Interfaces, HostId) {
  ::unsetenv("ANVIEW_HOST_ID");
  const std::string id = host_id();
  EXPECT_FALSE(id.empty());
  EXPECT_EQ(id, host_id());                          // stable
  EXPECT_NE(id.find(':'), std::string::npos) << id;  // hostname:boot_id on Linux
  ::setenv("ANVIEW_HOST_ID", "rack3-node7", 1);
  EXPECT_EQ(host_id(), "rack3-node7");
  ::unsetenv("ANVIEW_HOST_ID");
}

}  // namespace
}  // namespace anview::bootstrap
