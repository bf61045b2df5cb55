// Three "machines" as network namespaces joined by veth pairs to a bridge, so collectives really cross
// interfaces: ranks started with torchrun-style variables inside each namespace, the seed's Hydra form
// (`mpirun -f hosts -n 3 -ppn 1`) and Open MPI reaching the namespaces through an ssh stand-in agent. Needs root
// and `ip netns`.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "process_util.h"
#include "test_util.h"

namespace sd::dist {
namespace {

using json = nlohmann::json;
using sd::test::Process;
using std::chrono::seconds;

bool run_ip(const std::vector<std::string>& args, std::string* output = nullptr) {
  std::vector<std::string> argv{"ip"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = sd::test::run_process(argv, seconds(20));
  if (output) *output = r.output;
  return r.exit_code == 0;
}

// Creates the namespaces, veths and bridge; removes them in the destructor, also after a failed assertion.
class Machines {
 public:
  static constexpr int kCount = 3;

  Machines() {
    id_ = std::to_string(getpid() % 100000);
    subnet_ = "10.213." + std::to_string(getpid() % 250);
    cleanup();  // leftovers of a crashed run with the same id
  }
  ~Machines() { cleanup(); }

  // Empty on success, else what failed.
  std::string create() {
    const std::string br = bridge();
    if (!run_ip({"link", "add", br, "type", "bridge"})) return "cannot create bridge " + br;
    if (!run_ip({"addr", "add", subnet_ + ".254/24", "dev", br}) || !run_ip({"link", "set", br, "up"}))
      return "cannot configure bridge " + br;
    for (int i = 0; i < kCount; ++i) {
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

  std::string netns(int i) const { return "sdt" + id_ + char('a' + i); }
  std::string veth(int i) const { return "sdv" + id_ + char('a' + i); }
  std::string bridge() const { return "sdb" + id_; }
  std::string address(int i) const { return subnet_ + "." + std::to_string(i + 1); }

  // Bytes through machine i's cable, counted on the host side.
  int64_t bytes(int i) const {
    auto read = [&](const char* what) {
      std::ifstream in("/sys/class/net/" + veth(i) + "/statistics/" + what);
      int64_t v = -1;
      in >> v;
      return v;
    };
    return read("rx_bytes") + read("tx_bytes");
  }

 private:
  void cleanup() {
    for (int i = 0; i < kCount; ++i) {
      run_ip({"netns", "del", netns(i)});
      run_ip({"link", "del", veth(i)});
    }
    run_ip({"link", "del", bridge()});
  }
  std::string id_, subnet_;
};

std::string skip_reason() {
  if (geteuid() != 0) return "needs root to create network namespaces";
  if (!sd::test::have_program("ip")) return "the ip tool (iproute2) is not installed";
  if (sd::test::run_process({"ip", "netns", "list"}, seconds(10)).exit_code != 0) return "`ip netns` is unavailable";
  return "";
}

std::vector<json> json_lines(const std::string& output) {
  std::vector<json> lines;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty() && line[0] == '{') lines.push_back(json::parse(line));
  return lines;
}

std::map<std::string, std::string> clean_env() {
  std::map<std::string, std::string> env;
  for (const char* k : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "GLOO_SOCKET_IFNAME", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "SDTRAIN_LAUNCH"})
    env[k] = "\x01unset";
  return env;
}

class NetnsMachines : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string reason = skip_reason();
    if (!reason.empty()) GTEST_SKIP() << reason;
    machines_ = std::make_unique<Machines>();
    std::string err = machines_->create();
    if (!err.empty()) {
      machines_.reset();
      GTEST_SKIP() << "cannot build the namespaces (" << err << ")";
    }
  }
  void TearDown() override { machines_.reset(); }

  std::vector<int64_t> traffic() const {
    std::vector<int64_t> b;
    for (int i = 0; i < Machines::kCount; ++i) b.push_back(machines_->bytes(i));
    return b;
  }

  // Every machine's cable carried at least one allreduce share of the 1 MiB tensor.
  void expect_traffic_crossed(const std::vector<int64_t>& before) {
    auto after = traffic();
    for (int i = 0; i < Machines::kCount; ++i)
      EXPECT_GT(after[i] - before[i], 1 << 20) << "machine " << i << ": " << before[i] << " -> " << after[i];
  }

  // An ssh stand-in for the MPI launchers: "<agent> [options] <host> <command...>" runs the command inside the
  // namespace of the machine with that address, as ssh would run it on that host.
  std::filesystem::path write_agent(const std::filesystem::path& dir) const {
    auto agent = dir / "netns-agent";
    std::ofstream a(agent);
    a << "#!/bin/sh\nwhile [ \"${1#-}\" != \"$1\" ]; do shift; done\nhost=$1; shift\ncase \"$host\" in\n";
    for (int i = 0; i < Machines::kCount; ++i)
      a << "  " << machines_->address(i) << ") ns=" << machines_->netns(i) << ";;\n";
    a << "  *) echo \"agent: unknown host $host\" >&2; exit 1;;\nesac\nexec ip netns exec \"$ns\" sh -c \"$*\"\n";
    a.close();
    std::filesystem::permissions(agent, std::filesystem::perms::owner_all);
    return agent;
  }

  std::unique_ptr<Machines> machines_;
};

TEST_F(NetnsMachines, TorchrunStyleRanksInThreeNamespaces) {
  const int port = 29400 + getpid() % 500;
  auto before = traffic();
  std::vector<std::unique_ptr<Process>> ranks;
  for (int r = 0; r < Machines::kCount; ++r) {
    auto env = clean_env();
    env["RANK"] = std::to_string(r);
    env["WORLD_SIZE"] = "3";
    env["MASTER_ADDR"] = machines_->address(0);
    env["MASTER_PORT"] = std::to_string(port);
    env["GLOO_SOCKET_IFNAME"] = "eth1";
    ranks.push_back(std::make_unique<Process>(
        std::vector<std::string>{"ip", "netns", "exec", machines_->netns(r), sd::test::sdtrain_binary(), "dist-check",
                                 "--dist_timeout", "30"},
        env));
  }
  for (int r = 0; r < Machines::kCount; ++r) {
    ASSERT_TRUE(ranks[r]->wait(seconds(60))) << ranks[r]->output();
    EXPECT_EQ(ranks[r]->exit_code(), 0) << ranks[r]->output();
    auto lines = json_lines(ranks[r]->output());
    ASSERT_EQ(lines.size(), 1u) << ranks[r]->output();
    EXPECT_EQ(lines[0].at("rank"), r);
    EXPECT_EQ(lines[0].at("local_world_size"), 1);
    EXPECT_EQ(lines[0].at("master"), machines_->address(0) + ":" + std::to_string(port));
    EXPECT_TRUE(lines[0].at("allreduce_ok").get<bool>());
  }
  expect_traffic_crossed(before);
}

TEST_F(NetnsMachines, KilledRankOnAnotherMachineIsNamed) {
  const int port = 29900 + getpid() % 500;
  std::vector<std::unique_ptr<Process>> ranks;
  for (int r = 0; r < Machines::kCount; ++r) {
    auto env = clean_env();
    env["RANK"] = std::to_string(r);
    env["WORLD_SIZE"] = "3";
    env["MASTER_ADDR"] = machines_->address(0);
    env["MASTER_PORT"] = std::to_string(port);
    ranks.push_back(std::make_unique<Process>(
        std::vector<std::string>{"ip", "netns", "exec", machines_->netns(r), sd::test::sdtrain_binary(), "dist-check",
                                 "--dist_timeout", "15", "--fault_rank", "2", "--die_after_ms", "200"},
        env));
  }
  ASSERT_TRUE(sd::test::wait_all({ranks[0].get(), ranks[1].get(), ranks[2].get()}, seconds(90)));
  EXPECT_EQ(ranks[2]->exit_code(), 128 + 9);
  for (int r : {0, 1}) {
    EXPECT_EQ(ranks[r]->exit_code(), 1) << ranks[r]->output();
    EXPECT_NE(ranks[r]->output().find("sdtrain: error: rank 2 lost (connection closed) during"), std::string::npos)
        << ranks[r]->output();
    // Measured from the kill: heartbeats find it in seconds, well within the 15 s timeout.
    EXPECT_LT(ranks[r]->seconds() - ranks[2]->seconds(), 7.5) << ranks[r]->output();
  }
}

TEST_F(NetnsMachines, HydraSeedFormThroughAnAgent) {
  if (!sd::test::have_program("mpirun.mpich")) GTEST_SKIP() << "mpirun.mpich not installed (Debian: mpich)";
  sd::test::TempDir dir;
  auto agent = write_agent(dir.path());
  auto hosts = dir.path() / "hosts";
  {
    std::ofstream h(hosts);
    for (int i = 0; i < Machines::kCount; ++i) h << machines_->address(i) << "\n";
  }
  const int port = 30400 + getpid() % 500;
  auto mpirun = [&](bool with_master) {
    std::vector<std::string> argv{"mpirun.mpich", "-launcher", "ssh", "-launcher-exec", agent.string(),
                                  // Proxies in the namespaces reach mpirun's control port through the bridge.
                                  "-iface", machines_->bridge(), "-f", hosts.string(), "-n", "3", "-ppn", "1"};
    if (with_master) {
      const std::vector<std::string> genv{"-genv", "MASTER_ADDR", machines_->address(0),
                                          "-genv", "MASTER_PORT", std::to_string(port)};
      argv.insert(argv.end(), genv.begin(), genv.end());
    }
    // No GLOO_SOCKET_IFNAME: each rank binds to the address that routes to the master.
    const std::vector<std::string> command{sd::test::sdtrain_binary(), "dist-check", "--dist_timeout", "30"};
    argv.insert(argv.end(), command.begin(), command.end());
    return sd::test::run_process(argv, seconds(90), clean_env());
  };

  // Across machines, without MASTER_ADDR: the error says how to pass it.
  auto missing = mpirun(false);
  EXPECT_NE(missing.exit_code, 0) << missing.output;
  EXPECT_NE(missing.output.find("export MASTER_ADDR=<host of rank 0>"), std::string::npos) << missing.output;
  EXPECT_NE(missing.output.find("-genv MASTER_ADDR"), std::string::npos) << missing.output;

  auto before = traffic();
  auto r = mpirun(true);
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto lines = json_lines(r.output);
  ASSERT_EQ(lines.size(), 3u) << r.output;
  for (const auto& l : lines) {
    EXPECT_EQ(l.at("launcher"), "hydra");
    EXPECT_EQ(l.at("local_world_size"), 1);
    EXPECT_TRUE(l.at("allreduce_ok").get<bool>());
  }
  expect_traffic_crossed(before);
}

TEST_F(NetnsMachines, OpenMpiThroughAnAgent) {
  if (!sd::test::have_program("mpirun.openmpi")) GTEST_SKIP() << "mpirun.openmpi not installed (Debian: openmpi-bin)";
  sd::test::TempDir dir;
  auto agent = write_agent(dir.path());
  std::string host_list;
  for (int i = 0; i < Machines::kCount; ++i) host_list += (i ? "," : "") + machines_->address(i);
  const std::string subnet = machines_->address(0).substr(0, machines_->address(0).rfind('.')) + ".0/24";
  const int port = 30900 + getpid() % 500;
  auto before = traffic();
  auto r = sd::test::run_process(
      {"mpirun.openmpi", "--allow-run-as-root", "--mca", "plm_rsh_agent", agent.string(), "--mca",
       "plm_rsh_no_tree_spawn", "1",
       // Open MPI's daemons reach mpirun over the bridge's subnet.
       "--mca", "oob_tcp_if_include", subnet, "-H", host_list, "-n", "3", "-x", "MASTER_ADDR=" + machines_->address(0),
       "-x", "MASTER_PORT=" + std::to_string(port), sd::test::sdtrain_binary(), "dist-check", "--dist_timeout", "30"},
      seconds(90), clean_env());
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto lines = json_lines(r.output);
  ASSERT_EQ(lines.size(), 3u) << r.output;
  for (const auto& l : lines) {
    EXPECT_EQ(l.at("launcher"), "openmpi");
    EXPECT_EQ(l.at("local_world_size"), 1);
    EXPECT_TRUE(l.at("allreduce_ok").get<bool>());
  }
  expect_traffic_crossed(before);
}

}  // namespace
}  // namespace sd::dist
