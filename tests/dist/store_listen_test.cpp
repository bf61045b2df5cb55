// Where rank 0's rendezvous store listens: the address MASTER_ADDR names when it is this machine's (loopback only
// for single-machine runs), else every interface with the reason.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <set>

#include "dist/store_listen.h"

namespace sd::dist {
namespace {

DistEnv env_of(const std::string& master, int world, int local_world) {
  DistEnv env;
  env.world_size = world;
  env.local_world_size = local_world;
  env.master_addr = master;
  return env;
}

TEST(StoreListenAddress, SingleMachineRunsListenOnLoopback) {
  std::string why;
  EXPECT_EQ(store_listen_address(env_of("127.0.0.1", 2, 2), {}, &why), "127.0.0.1");
  EXPECT_EQ(store_listen_address(env_of("::1", 2, 2), {}, &why), "::1");
  // localhost resolves to a loopback address of either family.
  auto localhost = store_listen_address(env_of("localhost", 3, 3), {}, &why);
  ASSERT_TRUE(localhost.has_value()) << why;
  EXPECT_TRUE(*localhost == "127.0.0.1" || *localhost == "::1") << *localhost;
}

TEST(StoreListenAddress, MachineAddressIsKeptWhenItIsThisMachines) {
  std::string why;
  EXPECT_EQ(store_listen_address(env_of("10.77.0.1", 4, 2), {"127.0.0.1", "10.77.0.1"}, &why), "10.77.0.1");
  EXPECT_EQ(store_listen_address(env_of("10.77.0.1", 2, 2), {"10.77.0.1"}, &why), "10.77.0.1");
}

// A loopback MASTER_ADDR is loopback on every machine: listening elsewhere would serve no rank, and expose the store
// (torchrun-style variables without LOCAL_WORLD_SIZE look like ranks on several machines).
TEST(StoreListenAddress, ALoopbackMasterAddressListensOnLoopbackWhateverTheLauncherSays) {
  std::string why;
  EXPECT_EQ(store_listen_address(env_of("127.0.1.1", 4, 2), {"10.77.0.1"}, &why), "127.0.1.1");
  EXPECT_EQ(store_listen_address(env_of("127.0.0.1", 2, 1), {}, &why), "127.0.0.1");
  auto localhost = store_listen_address(env_of("localhost", 2, 1), {}, &why);
  ASSERT_TRUE(localhost.has_value()) << why;
}

TEST(StoreListenAddress, EveryInterfaceWithTheReasonOtherwise) {
  std::string why;
  // A hostname that resolves to loopback on rank 0's machine (Debian's 127.0.1.1) while ranks span machines: the
  // other machines, where it names an interface, could not reach a store on loopback.
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const auto own_name = store_listen_address(env_of(host, 4, 2), {"10.77.0.1"}, &why);
  if (why.find("a loopback address") != std::string::npos) {
    EXPECT_EQ(own_name, std::nullopt);
    EXPECT_NE(why.find(fmt::format("MASTER_ADDR={} is 127.", host)), std::string::npos) << why;
  }
  EXPECT_EQ(store_listen_address(env_of("10.77.0.9", 4, 2), {"10.77.0.1"}, &why), std::nullopt);
  EXPECT_NE(why.find("MASTER_ADDR=10.77.0.9 is not an address of rank 0's machine"), std::string::npos) << why;
  EXPECT_EQ(store_listen_address(env_of("no-such-host.invalid", 4, 2), {}, &why), std::nullopt);
  EXPECT_NE(why.find("does not resolve"), std::string::npos) << why;
}

TEST(StoreListenAddress, InterfaceAddressesIncludeLoopback) {
  auto local = local_interface_addresses();
  EXPECT_NE(std::find(local.begin(), local.end(), "127.0.0.1"), local.end());
}

// A socket listening on 0.0.0.0:port while alive.
struct Listener {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  explicit Listener(int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(port);
    ok = bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0 && listen(fd, 1) == 0;
  }
  ~Listener() { close(fd); }
  bool ok = false;
};

TEST(FindFreePort, ListenablePortsBelowTheEphemeralRangeNeverTheSameTwice) {
  int first = 0, last = 0;
  ASSERT_TRUE(std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> first >> last);
  std::set<int> seen;
  for (int i = 0; i < 50; ++i) {
    const int port = find_free_port();
    EXPECT_TRUE(port < first || port > last) << port << " is in the ephemeral range " << first << "-" << last;
    EXPECT_TRUE(seen.insert(port).second) << port << " came twice";
    EXPECT_TRUE(Listener(port).ok) << port;
  }
}

TEST(FindFreePort, PortsInUseAreSkipped) {
  // The calls walk the range in order, so the port after the last one returned is the next candidate.
  const int before = find_free_port();
  Listener held(before + 1);
  ASSERT_TRUE(held.ok) << before + 1;
  EXPECT_NE(find_free_port(), before + 1);
}

}  // namespace
}  // namespace sd::dist
