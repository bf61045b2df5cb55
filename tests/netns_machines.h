// "Machines" on one host: network namespaces, each with an eth1 joined by a veth pair to one bridge, so ranks in
// different namespaces really talk over network interfaces, and links that can be shaped with tc like a real
// network (bandwidth, delay). Shared by the multi-machine tests and bench_netns_scaling. Needs root and iproute2.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace sd::test {

// Why namespaces cannot be created here ("" if they can): not root, no `ip`, no `ip netns`.
std::string netns_skip_reason();

// The environment for a child process with every launcher's rank variables removed (for process_util's Process), so
// what started the tests cannot leak into the ranks they start.
std::map<std::string, std::string> launcher_free_env();

// One machine's link to the switch (the bridge). Zero means unshaped.
struct LinkShape {
  double gbit_per_s = 0;  // in each direction: what the machine sends and what it receives
  double delay_ms = 0;    // one way, added as the machine sends (tc netem; not every kernel has it)
};

// Creates the namespaces, veths and bridge; removes them (and their qdiscs) in the destructor, also after a failed
// assertion or an exception.
class Machines {
 public:
  explicit Machines(int count = 3);
  ~Machines();
  Machines(const Machines&) = delete;
  Machines& operator=(const Machines&) = delete;

  // Empty on success, else what failed.
  std::string create();
  // Shapes every machine's link: empty on success, else what failed (e.g. a kernel without netem for a delay).
  std::string shape(const LinkShape& link);

  int count() const { return count_; }
  std::string netns(int i) const { return "sdt" + id_ + char('a' + i); }
  std::string veth(int i) const { return "sdv" + id_ + char('a' + i); }  // the host side of machine i's cable
  std::string bridge() const { return "sdb" + id_; }
  std::string address(int i) const { return subnet_ + "." + std::to_string(i + 1); }
  // `argv` run inside machine i (`ip netns exec`).
  std::vector<std::string> on(int i, const std::vector<std::string>& argv) const;
  // The environment of rank `rank` of `world` started torchrun-style on machine `rank`, the master on machine 0.
  std::map<std::string, std::string> rank_env(int rank, int world, int master_port) const;

  // Bytes through machine i's cable so far (the host side's counters, so a rank cannot miss any).
  struct Traffic {
    int64_t sent = 0, received = 0;
    int64_t total() const { return sent + received; }
  };
  Traffic traffic(int i) const;

 private:
  std::string shape_one(const std::vector<std::string>& tc_prefix, const std::string& dev, const LinkShape& link,
                        bool machine_side);
  void cleanup();
  int count_;
  std::string id_, subnet_;
};

}  // namespace sd::test
