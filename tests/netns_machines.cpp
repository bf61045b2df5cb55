#include "netns_machines.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>

#include "process_util.h"

namespace sd::test {

namespace {

using std::chrono::seconds;

// Runs a command of iproute2 (`ip`, `tc`); true if it succeeded. `output` gets what it printed.
bool run_tool(const std::vector<std::string>& argv, std::string* output = nullptr) {
  auto r = run_process(argv, seconds(20));
  if (output) *output = r.output;
  return r.exit_code == 0;
}

bool run_ip(std::vector<std::string> args, std::string* output = nullptr) {
  args.insert(args.begin(), "ip");
  return run_tool(args, output);
}

int64_t read_counter(const std::string& dev, const char* what) {
  std::ifstream in("/sys/class/net/" + dev + "/statistics/" + what);
  int64_t v = -1;
  in >> v;
  return v;
}

}  // namespace

std::string netns_skip_reason() {
  if (geteuid() != 0) return "needs root to create network namespaces";
  if (!have_program("ip")) return "the ip tool (iproute2) is not installed";
  if (run_process({"ip", "netns", "list"}, seconds(10)).exit_code != 0) return "`ip netns` is unavailable";
  return "";
}

std::map<std::string, std::string> launcher_free_env() {
  std::map<std::string, std::string> env;
  for (const char* k : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "GLOO_SOCKET_IFNAME", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "SDTRAIN_LAUNCH"})
    env[k] = "\x01unset";
  return env;
}

Machines::Machines(int count) : count_(count) {
  // Names and subnet from the pid, so concurrent test processes do not collide.
  id_ = std::to_string(getpid() % 100000);
  subnet_ = "10.213." + std::to_string(getpid() % 250);
  cleanup();  // leftovers of a crashed run with the same id
}

Machines::~Machines() { cleanup(); }

std::string Machines::create() {
  const std::string br = bridge();
  if (!run_ip({"link", "add", br, "type", "bridge"})) return "cannot create bridge " + br;
  if (!run_ip({"addr", "add", subnet_ + ".254/24", "dev", br}) || !run_ip({"link", "set", br, "up"}))
    return "cannot configure bridge " + br;
  for (int i = 0; i < count_; ++i) {
    std::string ns = netns(i), host_side = veth(i), peer = "sdp" + id_ + char('a' + i);
    std::string err;
    if (!run_ip({"netns", "add", ns}, &err)) return "ip netns add " + ns + ": " + err;
    if (!run_ip({"link", "add", host_side, "type", "veth", "peer", "name", peer}, &err)) return "veth: " + err;
    if (!run_ip({"link", "set", peer, "netns", ns}) || !run_ip({"-n", ns, "link", "set", peer, "name", "eth1"}) ||
        !run_ip({"-n", ns, "addr", "add", address(i) + "/24", "dev", "eth1"}) ||
        !run_ip({"-n", ns, "link", "set", "eth1", "up"}) || !run_ip({"-n", ns, "link", "set", "lo", "up"}) ||
        !run_ip({"link", "set", host_side, "master", br}) || !run_ip({"link", "set", host_side, "up"}))
      return "cannot configure " + ns;
  }
  return "";
}

// A packet from machine A to machine B leaves through A's eth1 and then through the host side of B's veth (the
// switch port towards B), so shaping both egresses limits what each machine sends and what it receives, as a
// full-duplex link does. The delay is added once, on the machine side.
std::string Machines::shape(const LinkShape& link) {
  for (int i = 0; i < count_; ++i) {
    std::string err = shape_one({"tc", "-netns", netns(i)}, "eth1", link, true);
    if (err.empty()) err = shape_one({"tc"}, veth(i), link, false);
    if (!err.empty()) return netns(i) + ": " + err;
  }
  return "";
}

std::string Machines::shape_one(const std::vector<std::string>& tc_prefix, const std::string& dev,
                                const LinkShape& link, bool machine_side) {
  auto tc = [&](std::vector<std::string> args, std::string* output) {
    args.insert(args.begin(), tc_prefix.begin(), tc_prefix.end());
    return run_tool(args, output);
  };
  std::string out;
  tc({"qdisc", "del", "dev", dev, "root"}, &out);  // back to the default qdisc; fails harmlessly if it is
  if (link.gbit_per_s > 0) {
    const auto bits_per_s = static_cast<int64_t>(link.gbit_per_s * 1e9);
    // The bucket holds at least one 64 KiB GSO packet (veth offloads segmentation) and about 1 ms of traffic;
    // packets may queue 100 ms, like a switch buffer, before they are dropped.
    const int64_t burst = std::max<int64_t>(128 << 10, bits_per_s / 8 / 1000);
    if (!tc({"qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf", "rate", std::to_string(bits_per_s) + "bit",
             "burst", std::to_string(burst), "latency", "100ms"},
            &out))
      return "tc tbf on " + dev + ": " + out;
  }
  if (machine_side && link.delay_ms > 0) {
    std::vector<std::string> args{"qdisc", "add", "dev", dev};
    // Under the rate limit when there is one, so delayed packets still leave at the link's rate.
    if (link.gbit_per_s > 0)
      args.insert(args.end(), {"parent", "1:1"});
    else
      args.push_back("root");
    args.insert(args.end(),
                {"handle", "10:", "netem", "delay", std::to_string(std::lround(link.delay_ms * 1000)) + "us"});
    if (!tc(args, &out)) return "tc netem on " + dev + " (a delay needs the kernel's sch_netem): " + out;
  }
  return "";
}

std::vector<std::string> Machines::on(int i, const std::vector<std::string>& argv) const {
  std::vector<std::string> out{"ip", "netns", "exec", netns(i)};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

std::map<std::string, std::string> Machines::rank_env(int rank, int world, int master_port) const {
  auto env = launcher_free_env();
  env["RANK"] = std::to_string(rank);
  env["WORLD_SIZE"] = std::to_string(world);
  env["MASTER_ADDR"] = address(0);
  env["MASTER_PORT"] = std::to_string(master_port);
  return env;
}

Machines::Traffic Machines::traffic(int i) const {
  // The host side receives what the machine sends.
  return {read_counter(veth(i), "rx_bytes"), read_counter(veth(i), "tx_bytes")};
}

void Machines::cleanup() {
  // Deleting a namespace and a veth also removes their qdiscs.
  for (int i = 0; i < count_; ++i) {
    run_ip({"netns", "del", netns(i)});
    run_ip({"link", "del", veth(i)});
  }
  run_ip({"link", "del", bridge()});
}

}  // namespace sd::test
