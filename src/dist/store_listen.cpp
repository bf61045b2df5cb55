#include "dist/store_listen.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <random>

#include "core/error.h"

namespace sd::dist {
namespace {

std::string numeric_address(const sockaddr* addr) {
  char buf[INET6_ADDRSTRLEN] = {};
  const void* raw = addr->sa_family == AF_INET
                        ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(addr)->sin_addr)
                        : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr);
  return inet_ntop(addr->sa_family, raw, buf, sizeof buf) ? std::string(buf) : std::string();
}

bool is_loopback(const std::string& address) {
  in_addr v4{};
  if (inet_pton(AF_INET, address.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, address.c_str(), &v6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

// The wildcard bind to narrow, and what to bind instead: written before `active` is set, read by bind().
struct Narrowing {
  std::atomic<bool> active{false};
  std::atomic<bool> narrowed{false};
  int port = 0;
  bool has_v4 = false;
  in_addr v4{};
  bool has_v6 = false;  // a real IPv6 address, or an IPv4 one mapped for a dual-stack socket
  in6_addr v6{};
};
Narrowing g_narrowing;

bool is_wildcard_at(const sockaddr* addr, socklen_t len, int port) {
  if (addr->sa_family == AF_INET && len >= sizeof(sockaddr_in)) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(addr);
    return a->sin_addr.s_addr == htonl(INADDR_ANY) && ntohs(a->sin_port) == port;
  }
  if (addr->sa_family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(addr);
    return IN6_IS_ADDR_UNSPECIFIED(&a->sin6_addr) && ntohs(a->sin6_port) == port;
  }
  return false;
}

// The ports the kernel hands out on its own, [first, last]; Linux's default when /proc cannot say.
std::pair<int, int> ephemeral_port_range() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int first = 0, last = 0;
  if (in >> first >> last && 0 < first && first <= last && last <= 65535) return {first, last};
  return {32768, 60999};
}

// Binding the wildcard address fails while any socket holds the port, on any address or in TIME_WAIT.
bool nothing_bound_to(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(port);
  const bool free = ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return free;
}

}  // namespace

int find_free_port() {
  // Up to 10000 unprivileged ports below the ephemeral range, or above it when it starts too low to leave room.
  const auto [first, last] = ephemeral_port_range();
  const bool below = first - 1024 >= 1000;
  const int lowest = below ? std::max(1024, first - 10000) : last + 1;
  const int count = below ? first - lowest : 65536 - lowest;
  // A random start keeps concurrent jobs apart; the counter keeps this process's successive calls apart.
  static std::atomic<unsigned> next{std::random_device{}()};
  for (int tried = 0; tried < count; ++tried) {
    const int port = lowest + static_cast<int>(next.fetch_add(1) % static_cast<unsigned>(count));
    if (nothing_bound_to(port)) return port;
  }
  fail("no free port outside the kernel's ephemeral range {}-{} for the rendezvous store; pass --master_port", first,
       last);
}

std::vector<std::string> local_interface_addresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i; i = i->ifa_next)
    if (i->ifa_addr && (i->ifa_addr->sa_family == AF_INET || i->ifa_addr->sa_family == AF_INET6))
      out.push_back(numeric_address(i->ifa_addr));
  freeifaddrs(list);
  return out;
}

std::optional<std::string> store_listen_address(const DistEnv& env, const std::vector<std::string>& local_addresses,
                                                std::string* why) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(env.master_addr.c_str(), nullptr, &hints, &found) != 0 || !found) {
    *why = fmt::format("MASTER_ADDR={} does not resolve on rank 0's machine", env.master_addr);
    return std::nullopt;
  }
  std::vector<std::string> resolved;
  for (addrinfo* ai = found; ai; ai = ai->ai_next)
    if (ai->ai_family == AF_INET || ai->ai_family == AF_INET6) resolved.push_back(numeric_address(ai->ai_addr));
  freeaddrinfo(found);
  // A loopback address or "localhost" as MASTER_ADDR means this machine on every machine: ranks elsewhere could only
  // reach it through a tunnel, which ends on loopback too. A hostname that resolves to loopback here alone (Debian's
  // 127.0.1.1 for the machine's own name) may be an interface address on the others.
  const bool loopback_everywhere = is_loopback(env.master_addr) || env.master_addr == "localhost";
  std::optional<std::string> loopback_seen;
  for (const auto& address : resolved) {
    const bool loopback = is_loopback(address);
    const bool local = loopback || std::count(local_addresses.begin(), local_addresses.end(), address) > 0;
    if (!local) continue;
    if (loopback && !env.single_node() && !loopback_everywhere) {
      loopback_seen = address;
      continue;
    }
    return address;
  }
  if (loopback_seen)
    *why = fmt::format(
        "MASTER_ADDR={} is {} on rank 0's machine, a loopback address, while the ranks span machines: set MASTER_ADDR "
        "to rank 0's address on the network the ranks share",
        env.master_addr, *loopback_seen);
  else
    *why = fmt::format("MASTER_ADDR={} is not an address of rank 0's machine", env.master_addr);
  return std::nullopt;
}

StoreBindNarrowing::StoreBindNarrowing(const std::string& address, int port) {
  SD_CHECK(!g_narrowing.active.load(), "the rendezvous store is being created twice at once");
  g_narrowing.port = port;
  g_narrowing.narrowed = false;
  g_narrowing.has_v4 = inet_pton(AF_INET, address.c_str(), &g_narrowing.v4) == 1;
  g_narrowing.has_v6 = inet_pton(AF_INET6, address.c_str(), &g_narrowing.v6) == 1;
  if (g_narrowing.has_v4) {
    // ::ffff:a.b.c.d: the same address for an IPv6 socket that also takes IPv4 (as c10d's listening socket does).
    std::memset(&g_narrowing.v6, 0, sizeof g_narrowing.v6);
    g_narrowing.v6.s6_addr[10] = g_narrowing.v6.s6_addr[11] = 0xff;
    std::memcpy(&g_narrowing.v6.s6_addr[12], &g_narrowing.v4, 4);
    g_narrowing.has_v6 = true;
  }
  SD_CHECK(g_narrowing.has_v6, "'{}' is not a numeric IPv4 or IPv6 address", address);
  g_narrowing.active = true;
}

StoreBindNarrowing::~StoreBindNarrowing() { g_narrowing.active = false; }

bool StoreBindNarrowing::narrowed() const { return g_narrowing.narrowed.load(); }

}  // namespace sd::dist

// Interposes libc's bind() for the whole process (the executable's definition comes first in symbol lookup, so
// LibTorch's calls land here); everything but the one wildcard bind being narrowed goes straight to libc's.
extern "C" int bind(int fd, const sockaddr* addr, socklen_t len) {
  using BindFn = int (*)(int, const sockaddr*, socklen_t);
  static const BindFn real_bind = reinterpret_cast<BindFn>(dlsym(RTLD_NEXT, "bind"));
  using sd::dist::g_narrowing;
  if (!g_narrowing.active.load() || !addr || !sd::dist::is_wildcard_at(addr, len, g_narrowing.port))
    return real_bind(fd, addr, len);
  int result;
  if (addr->sa_family == AF_INET && g_narrowing.has_v4) {
    sockaddr_in narrow = *reinterpret_cast<const sockaddr_in*>(addr);
    narrow.sin_addr = g_narrowing.v4;
    result = real_bind(fd, reinterpret_cast<const sockaddr*>(&narrow), sizeof narrow);
  } else if (addr->sa_family == AF_INET6) {
    sockaddr_in6 narrow = *reinterpret_cast<const sockaddr_in6*>(addr);
    narrow.sin6_addr = g_narrowing.v6;
    result = real_bind(fd, reinterpret_cast<const sockaddr*>(&narrow), sizeof narrow);
  } else {
    // An IPv6 address for an IPv4 socket: refuse, so that c10d tries its IPv6 socket instead.
    errno = EADDRNOTAVAIL;
    return -1;
  }
  if (result == 0) g_narrowing.narrowed = true;
  return result;
}
