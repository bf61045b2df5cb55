// Where rank 0's rendezvous store listens. The store has no authentication (whoever reaches its port can read and
// write the run's keys, and so stop or confuse the run), so it listens only on the address the ranks connect to:
// loopback for a single-machine run. LibTorch 1.13's TCPStore server always binds the wildcard address and has no
// option for another, hence StoreBindNarrowing below.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "dist/rendezvous.h"

namespace sd::dist {

// The numeric address for the store: the first address MASTER_ADDR resolves to that belongs to this machine,
// loopback included only when every rank runs on this machine (a hostname that resolves to 127.0.1.1 locally must
// not hide the store from the other machines). nullopt when there is none; *why then says so for a warning.
// `local_addresses` are this machine's (local_interface_addresses()); loopback ranges count as local anyway.
std::optional<std::string> store_listen_address(const DistEnv& env, const std::vector<std::string>& local_addresses,
                                                std::string* why);

// A TCP port nothing on this machine is bound to, for rank 0's store when the user names none. It is chosen below
// the kernel's ephemeral range (net.ipv4.ip_local_port_range), where no socket bound to port 0 or connecting out
// (Gloo's pairs, mpirun's daemons, another job's ranks) can be handed it before rank 0 binds it; a port the kernel
// picked, as torchrun does, can be. Successive calls in one process return different ports.
int find_free_port();

// Numeric addresses of this machine's interfaces (getifaddrs), IPv4 and IPv6.
std::vector<std::string> local_interface_addresses();

// While alive, a bind() in this process of a wildcard address (0.0.0.0 or ::) at `port` binds `address` instead
// (IPv4 in an IPv6 socket as ::ffff:a.b.c.d): the one way to choose the TCPStore server's address in LibTorch
// 1.13. Other binds pass through unchanged. One at a time.
class StoreBindNarrowing {
 public:
  StoreBindNarrowing(const std::string& address, int port);
  ~StoreBindNarrowing();
  StoreBindNarrowing(const StoreBindNarrowing&) = delete;
  StoreBindNarrowing& operator=(const StoreBindNarrowing&) = delete;
  // True once a wildcard bind was narrowed (and succeeded).
  bool narrowed() const;
};

}  // namespace sd::dist
