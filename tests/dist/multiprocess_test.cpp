// The real binary's dist-check under every launcher (sdtrain launch, Open MPI, MPICH Hydra, torchrun-style
// variables), plus faults: a rank SIGKILLed, a rank hung, SIGTERM agreement, launch's failure propagation.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <fstream>
#include <set>
#include <sstream>

#include "dist/store_listen.h"
#include "dist/threads.h"
#include "process_util.h"
#include "test_util.h"

extern char** environ;

namespace sd::dist {
namespace {

using json = nlohmann::json;
using sd::test::Process;
using std::chrono::milliseconds;
using std::chrono::seconds;

// Removes whatever launcher started the test binary itself, so each test sees only the launcher it sets up.
std::map<std::string, std::string> clean_env() {
  std::map<std::string, std::string> env;
  const std::vector<std::string> prefixes{"OMPI_", "PMI_", "PMIX_", "MPI_LOCAL", "SLURM_", "HYDRA_", "I_MPI_"};
  const std::set<std::string> names{
      "RANK",        "WORLD_SIZE",         "LOCAL_RANK",     "LOCAL_WORLD_SIZE",   "MASTER_ADDR",
      "MASTER_PORT", "GLOO_SOCKET_IFNAME", "SDTRAIN_LAUNCH", "TORCHELASTIC_RUN_ID"};
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    std::string key = entry.substr(0, entry.find('='));
    bool drop = names.count(key) > 0;
    for (const auto& p : prefixes) drop = drop || key.rfind(p, 0) == 0;
    if (drop) env[key] = "\x01unset";
  }
  return env;
}

std::vector<json> json_lines(const std::string& output) {
  std::vector<json> lines;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty() && line[0] == '{') lines.push_back(json::parse(line));
  return lines;
}

std::vector<std::string> lines_of(const std::string& output) {
  std::vector<std::string> lines;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) lines.push_back(line);
  return lines;
}

// Every rank 0..world-1 reported once, with correct collectives and the expected launcher and placement. Ranks
// of one machine send the ring collectives through shared memory unless told otherwise.
void expect_world(const std::vector<json>& lines, int world, const std::string& launcher, int local_world,
                  const std::string& output, const std::string& ring_transport = "shared memory") {
  ASSERT_EQ(static_cast<int>(lines.size()), world) << output;
  std::set<int> ranks;
  for (const auto& l : lines) {
    ranks.insert(l.at("rank").get<int>());
    EXPECT_EQ(l.at("world_size"), world) << l;
    EXPECT_EQ(l.at("local_world_size"), local_world) << l;
    EXPECT_EQ(l.at("launcher"), launcher) << l;
    EXPECT_EQ(l.at("backend"), "gloo") << l;
    EXPECT_TRUE(l.at("allreduce_ok").get<bool>()) << l;
    EXPECT_TRUE(l.at("broadcast_ok").get<bool>()) << l;
    EXPECT_TRUE(l.at("all_gather_ok").get<bool>()) << l;
    EXPECT_TRUE(l.at("reduce_scatter_ok").get<bool>()) << l;
    EXPECT_TRUE(l.at("ring_all_gather_ok").get<bool>()) << l;
    EXPECT_EQ(l.at("ring_transport"), ring_transport) << l;
    EXPECT_EQ(l.at("threads"), std::max(1, affinity_core_count() / local_world)) << l;
  }
  EXPECT_EQ(static_cast<int>(ranks.size()), world) << output;
}

// Starts `world` ranks with torchrun-style variables, as Kubeflow's PyTorchJob or a test harness would.
std::vector<std::unique_ptr<Process>> start_torchrun_style(int world, const std::vector<std::string>& args,
                                                           int port = find_free_port()) {
  std::vector<std::unique_ptr<Process>> procs;
  for (int r = 0; r < world; ++r) {
    auto env = clean_env();
    env["RANK"] = std::to_string(r);
    env["WORLD_SIZE"] = std::to_string(world);
    env["LOCAL_RANK"] = std::to_string(r);
    env["LOCAL_WORLD_SIZE"] = std::to_string(world);
    env["MASTER_ADDR"] = "127.0.0.1";
    env["MASTER_PORT"] = std::to_string(port);
    std::vector<std::string> argv{sd::test::sdtrain_binary(), "dist-check"};
    argv.insert(argv.end(), args.begin(), args.end());
    procs.push_back(std::make_unique<Process>(argv, env));
  }
  return procs;
}

TEST(DistProcesses, SdtrainLaunchTwoRanks) {
  for (const std::string transport : {"auto", "tcp"}) {
    // 9 MiB: the ring collectives' messages span several shared-memory pieces.
    auto r = sd::test::run_process({sd::test::sdtrain_binary(), "launch", "--nproc_per_node", "2", "--", "dist-check",
                                    "--dist_timeout", "30", "--size_mb", "9", "--dist_transport", transport},
                                   seconds(60), clean_env());
    ASSERT_FALSE(r.timed_out) << r.output;
    EXPECT_EQ(r.exit_code, 0) << r.output;
    auto lines = json_lines(r.output);
    expect_world(lines, 2, "sdtrain-launch", 2, r.output, transport == "tcp" ? "tcp" : "shared memory");
    for (const auto& l : lines) EXPECT_EQ(l.at("master").get<std::string>().rfind("127.0.0.1:", 0), 0u) << l;
  }
}

TEST(DistProcesses, OpenMpiTwoAndThreeRanks) {
  if (!sd::test::have_program("mpirun.openmpi")) GTEST_SKIP() << "mpirun.openmpi not installed (Debian: openmpi-bin)";
  for (int n : {2, 3}) {
    // A free MASTER_PORT rather than the default 29500, so tests running in parallel do not meet.
    auto env = clean_env();
    env["MASTER_PORT"] = std::to_string(find_free_port());
    auto r = sd::test::run_process({"mpirun.openmpi", "--allow-run-as-root", "--oversubscribe", "-n", std::to_string(n),
                                    sd::test::sdtrain_binary(), "dist-check", "--dist_timeout", "30"},
                                   seconds(60), env);
    ASSERT_FALSE(r.timed_out) << r.output;
    EXPECT_EQ(r.exit_code, 0) << r.output;
    expect_world(json_lines(r.output), n, "openmpi", n, r.output);
  }
}

TEST(DistProcesses, HydraHostfileForm) {
  if (!sd::test::have_program("mpirun.mpich")) GTEST_SKIP() << "mpirun.mpich not installed (Debian: mpich)";
  sd::test::TempDir dir;
  auto hosts = dir.path() / "hosts";
  std::ofstream(hosts) << "localhost\n";
  // The seed's form: -f hostfile -n N -ppn K.
  auto env = clean_env();
  env["MASTER_PORT"] = std::to_string(find_free_port());
  auto r = sd::test::run_process({"mpirun.mpich", "-f", hosts.string(), "-n", "3", "-ppn", "3",
                                  sd::test::sdtrain_binary(), "dist-check", "--dist_timeout", "30"},
                                 seconds(60), env);
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  expect_world(json_lines(r.output), 3, "hydra", 3, r.output);
}

TEST(DistProcesses, TorchrunStyleVariables) {
  auto procs = start_torchrun_style(3, {"--dist_timeout", "30", "--threads", "1"});
  std::vector<json> lines;
  std::string all;
  for (auto& p : procs) {
    ASSERT_TRUE(p->wait(seconds(60))) << p->output();
    EXPECT_EQ(p->exit_code(), 0) << p->output();
    all += p->output();
  }
  for (const auto& l : json_lines(all)) {
    EXPECT_EQ(l.at("launcher"), "env");
    EXPECT_EQ(l.at("threads"), 1);
    EXPECT_TRUE(l.at("allreduce_ok").get<bool>());
  }
  EXPECT_EQ(json_lines(all).size(), 3u) << all;
}

// Kubeflow's PyTorchJob and hand-set variables often give no LOCAL_WORLD_SIZE: the ranks count the ones sharing their
// machine at the rendezvous and divide its CPUs among them, instead of each taking them all.
TEST(DistProcesses, RanksWithoutLocalWorldSizeShareTheMachinesCpus) {
  std::vector<std::unique_ptr<Process>> procs;
  const int port = find_free_port();
  for (int r = 0; r < 2; ++r) {
    auto env = clean_env();
    env["RANK"] = std::to_string(r);
    env["WORLD_SIZE"] = "2";
    env["MASTER_ADDR"] = "127.0.0.1";
    env["MASTER_PORT"] = std::to_string(port);
    procs.push_back(std::make_unique<Process>(
        std::vector<std::string>{sd::test::sdtrain_binary(), "dist-check", "--dist_timeout", "30"}, env));
  }
  std::string all;
  for (auto& p : procs) {
    ASSERT_TRUE(p->wait(seconds(60))) << p->output();
    EXPECT_EQ(p->exit_code(), 0) << p->output();
    all += p->output();
  }
  ASSERT_EQ(json_lines(all).size(), 2u) << all;
  for (const auto& l : json_lines(all)) {
    EXPECT_EQ(l.at("local_world_size"), 1) << l;  // what the environment said
    EXPECT_EQ(l.at("threads"), std::max(1, affinity_core_count() / 2)) << l;
  }
  EXPECT_EQ(all.find("listens on every interface"), std::string::npos) << all;
}

// --dist_transport is chosen per machine; ranks of one machine that were told differently agree on TCP at once
// rather than waiting for each other until the timeout.
TEST(DistProcesses, RanksOfOneMachineToldDifferentTransportsAgreeOnTcp) {
  std::vector<std::unique_ptr<Process>> procs;
  const int port = find_free_port();
  for (int r = 0; r < 2; ++r) {
    auto env = clean_env();
    env.insert({{"RANK", std::to_string(r)},
                {"WORLD_SIZE", "2"},
                {"LOCAL_RANK", std::to_string(r)},
                {"LOCAL_WORLD_SIZE", "2"},
                {"MASTER_ADDR", "127.0.0.1"},
                {"MASTER_PORT", std::to_string(port)}});
    procs.push_back(
        std::make_unique<Process>(std::vector<std::string>{sd::test::sdtrain_binary(), "dist-check", "--dist_timeout",
                                                           "60", "--dist_transport", r == 0 ? "tcp" : "auto"},
                                  env));
  }
  std::string all;
  for (auto& p : procs) {
    ASSERT_TRUE(p->wait(seconds(90))) << p->output();
    EXPECT_EQ(p->exit_code(), 0) << p->output();
    EXPECT_LT(p->seconds(), 30) << p->output();
    all += p->output();
  }
  ASSERT_EQ(json_lines(all).size(), 2u) << all;
  for (const auto& l : json_lines(all)) EXPECT_EQ(l.at("ring_transport"), "tcp") << l;
}

std::vector<Process*> raw(const std::vector<std::unique_ptr<Process>>& procs) {
  std::vector<Process*> r;
  for (auto& p : procs) r.push_back(p.get());
  return r;
}

// Rank `victim` SIGKILLs itself after the first allreduce; the others must exit non-zero with one error line naming
// it, starting with `expected`, well before the timeout. Rank 0 is special: it hosts the store, so its loss is seen
// through the store.
void expect_killed_rank_named(int victim, const std::string& expected) {
  const double timeout = 10;
  auto procs = start_torchrun_style(
      3, {"--dist_timeout", "10", "--fault_rank", std::to_string(victim), "--die_after_ms", "300", "--threads", "1"});
  ASSERT_TRUE(sd::test::wait_all(raw(procs), seconds(90)));
  EXPECT_EQ(procs[victim]->exit_code(), 128 + SIGKILL);
  std::vector<std::string> outputs;
  for (int r = 0; r < 3; ++r) {
    if (r == victim) continue;
    const std::string out = procs[r]->output();
    EXPECT_EQ(procs[r]->exit_code(), 1) << out;
    auto lines = lines_of(out);
    // One line, naming the lost rank and the collective.
    ASSERT_EQ(lines.size(), 1u) << out;
    EXPECT_EQ(lines[0].rfind(sd::test::rank_error(r) + expected, 0), 0u) << out;
    // Found by the heartbeats / the store, not by waiting out the timeout. Measured from the kill, since start-up
    // alone can take seconds on a loaded machine.
    EXPECT_LT(procs[r]->seconds() - procs[victim]->seconds(), timeout) << out;
    outputs.push_back(out.substr(out.find("error: ")));
  }
  if (victim != 0) {
    EXPECT_EQ(outputs[0], outputs[1]);  // all survivors print the one published conclusion, each as itself
  }
}

TEST(DistProcesses, KilledRankIsNamedByTheOthersBeforeTheTimeout) {
  expect_killed_rank_named(1, "rank 1 lost (connection closed) during ");
}

TEST(DistProcesses, KilledRankZeroIsNamedThroughTheStore) {
  expect_killed_rank_named(0, "rank 0 lost (connection to the master store at 127.0.0.1:");
}

TEST(DistProcesses, HungRankIsNamedAndEndsItself) {
  auto procs = start_torchrun_style(3, {"--dist_timeout", "2", "--fault_rank", "2", "--hang", "--threads", "1"});
  ASSERT_TRUE(sd::test::wait_all(raw(procs), seconds(90)));
  for (int r : {0, 1}) {
    const std::string out = procs[r]->output();
    EXPECT_EQ(procs[r]->exit_code(), 1) << out;
    auto lines = lines_of(out);
    ASSERT_EQ(lines.size(), 1u) << out;
    EXPECT_NE(lines[0].find("rank 2 did not reach "), std::string::npos) << out;
    EXPECT_NE(lines[0].find("within 2 s"), std::string::npos) << out;
  }
  // The hung rank's own watchdog ends it (no launcher here would), with the same diagnosis.
  EXPECT_EQ(procs[2]->exit_code(), 1) << procs[2]->output();
  EXPECT_NE(procs[2]->output().find("rank 2 did not reach"), std::string::npos) << procs[2]->output();
  EXPECT_NE(procs[2]->output().find("made no progress"), std::string::npos) << procs[2]->output();
}

TEST(DistProcesses, FrozenRankIsNamed) {
  // SIGSTOP freezes the whole process, heartbeat included (a stopped or swapped-out machine): the others wait out
  // the 3 s timeout and then see a heartbeat that stopped.
  auto procs = start_torchrun_style(3, {"--dist_timeout", "3", "--wait_for_stop", "--threads", "1"});
  for (int r = 0; r < 3; ++r)
    ASSERT_TRUE(procs[r]->wait_for_output("waiting for a stop signal", seconds(60))) << procs[r]->output();
  procs[1]->signal(SIGSTOP);
  ASSERT_TRUE(sd::test::wait_all({procs[0].get(), procs[2].get()}, seconds(60)));
  for (int r : {0, 2}) {
    EXPECT_EQ(procs[r]->exit_code(), 1) << procs[r]->output();
    EXPECT_NE(
        procs[r]->output().find(sd::test::rank_error(r) + "rank 1 lost (no heartbeat for 1 s) during all_gather #"),
        std::string::npos)
        << procs[r]->output();
  }
  // procs[1] is killed (SIGKILL reaches stopped processes) when it goes out of scope.
}

// Rank 0 hosts the rendezvous store, so SIGSTOP on it freezes the store too (its machine still accepts
// connections): every wait of the others (the collective, the diagnosis and the heartbeat reading the store,
// shutdown) must still end, naming rank 0, within the timeout plus one heartbeat window (1 s here) and some slack.
TEST(DistProcesses, FrozenRankZeroIsNamedWithinTheTimeout) {
  const auto timeout = seconds(3);
  auto procs = start_torchrun_style(3, {"--dist_timeout", "3", "--wait_for_stop", "--threads", "1"});
  for (int r = 0; r < 3; ++r)
    ASSERT_TRUE(procs[r]->wait_for_output("waiting for a stop signal", seconds(60))) << procs[r]->output();
  procs[0]->signal(SIGSTOP);
  const auto frozen_at = std::chrono::steady_clock::now();
  const bool ended = sd::test::wait_all({procs[1].get(), procs[2].get()}, seconds(60));
  const auto waited = std::chrono::steady_clock::now() - frozen_at;
  ASSERT_TRUE(ended) << "ranks 1 and 2 still waiting 60 s after rank 0 froze:\n"
                     << procs[1]->output() << procs[2]->output();
  for (int r : {1, 2}) {
    const std::string out = procs[r]->output();
    EXPECT_EQ(procs[r]->exit_code(), 1) << out;
    auto lines = lines_of(out);
    ASSERT_EQ(lines.size(), 2u) << out;  // the "waiting" line and the error
    EXPECT_EQ(lines[1].rfind(sd::test::rank_error(r) + "rank 0 lost (the master store at 127.0.0.1:", 0), 0u) << out;
    EXPECT_NE(lines[1].find("did not answer within 1 s"), std::string::npos) << out;
  }
  EXPECT_LT(waited, timeout + seconds(5));
  // procs[0] is killed (SIGKILL reaches stopped processes) when it goes out of scope.
}

// The same under sdtrain launch: the surviving ranks fail, and launch ends the frozen rank 0 (SIGTERM stays pending
// on a stopped process; SIGKILL after the grace period does not) and exits.
TEST(DistProcesses, LaunchEndsWhenRankZeroIsFrozen) {
  Process launch({sd::test::sdtrain_binary(), "launch", "--nproc_per_node", "3", "--grace_period", "1", "--",
                  "dist-check", "--dist_timeout", "3", "--wait_for_stop", "--threads", "1"},
                 clean_env());
  for (int r = 0; r < 3; ++r)
    ASSERT_TRUE(launch.wait_for_output(fmt::format("rank {} waiting for a stop signal", r), seconds(60)))
        << launch.output();
  const std::string out = launch.output();
  const std::string marker = "rank 0 waiting for a stop signal (pid ";
  const pid_t rank0 = std::atoi(out.c_str() + out.find(marker) + marker.size());
  ASSERT_GT(rank0, 1) << out;
  ASSERT_EQ(kill(rank0, SIGSTOP), 0);
  ASSERT_TRUE(launch.wait(seconds(60))) << "launch still running 60 s after rank 0 froze:\n" << launch.output();
  EXPECT_EQ(launch.exit_code(), 1) << launch.output();
  EXPECT_NE(launch.output().find(sd::test::rank_error(1) + "rank 0 lost (the master store at 127.0.0.1:"),
            std::string::npos)
      << launch.output();
  EXPECT_NE(launch.output().find("sending SIGKILL"), std::string::npos) << launch.output();
}

// Local addresses (hex, as /proc/net/tcp and tcp6 print them) of the TCP sockets listening on `port`.
std::vector<std::string> listening_addresses(int port) {
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const auto colon = local.rfind(':');
      if (state == "0A" && std::stoi(local.substr(colon + 1), nullptr, 16) == port)
        out.push_back(local.substr(0, colon));
    }
  }
  return out;
}

bool connects(const std::string& ipv4, int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, ipv4.c_str(), &addr.sin_addr);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return ok;
}

// The store has no authentication, so on one machine it must not be reachable from the network.
TEST(DistProcesses, LaunchStoreListensOnLoopbackOnly) {
  const int port = find_free_port();
  Process launch({sd::test::sdtrain_binary(), "launch", "--nproc_per_node", "2", "--master_port", std::to_string(port),
                  "--", "dist-check", "--dist_timeout", "30", "--wait_for_stop", "--threads", "1"},
                 clean_env());
  for (int r = 0; r < 2; ++r)
    ASSERT_TRUE(launch.wait_for_output(fmt::format("rank {} waiting for a stop signal", r), seconds(60)))
        << launch.output();
  const auto listening = listening_addresses(port);
  ASSERT_FALSE(listening.empty()) << "nothing listens on port " << port;
  const std::set<std::string> loopback{"0100007F", "0000000000000000FFFF00000100007F",
                                       "00000000000000000000000001000000"};
  for (const auto& address : listening) EXPECT_TRUE(loopback.count(address)) << address << " is not loopback";
  int tried = 0;
  for (const auto& address : local_interface_addresses()) {
    if (address.find(':') != std::string::npos || address.rfind("127.", 0) == 0) continue;
    EXPECT_FALSE(connects(address, port)) << "the store answers on " << address;
    ++tried;
  }
  if (tried == 0) std::printf("(no non-loopback IPv4 address on this machine to try a connection on)\n");
  launch.signal(SIGTERM);
  ASSERT_TRUE(launch.wait(seconds(30))) << launch.output();
  EXPECT_EQ(launch.exit_code(), 0) << launch.output();
}

TEST(DistProcesses, ASignalToOneRankStopsAllAtTheSameStep) {
  auto procs = start_torchrun_style(2, {"--dist_timeout", "30", "--wait_for_stop", "--threads", "1"});
  for (int r = 0; r < 2; ++r)
    ASSERT_TRUE(procs[r]->wait_for_output("waiting for a stop signal", seconds(60))) << procs[r]->output();
  std::this_thread::sleep_for(milliseconds(300));  // let a few steps pass
  procs[1]->signal(SIGINT);
  std::vector<json> lines;
  for (auto& p : procs) {
    ASSERT_TRUE(p->wait(seconds(30))) << p->output();
    EXPECT_EQ(p->exit_code(), 0) << p->output();
    auto l = json_lines(p->output());
    ASSERT_EQ(l.size(), 1u) << p->output();
    lines.push_back(l[0]);
  }
  EXPECT_TRUE(lines[0].at("stopped").get<bool>());
  EXPECT_TRUE(lines[1].at("stopped").get<bool>());
  EXPECT_EQ(lines[0].at("steps"), lines[1].at("steps"));
  EXPECT_GT(lines[0].at("steps").get<int>(), 0);
  EXPECT_EQ(lines[0].at("stop_signal"), 0);
  EXPECT_EQ(lines[1].at("stop_signal"), SIGINT);
  // Both exit as the signalled rank does (train: 128 + SIGINT on every rank).
  EXPECT_EQ(lines[0].at("run_stop_signal"), SIGINT);
  EXPECT_EQ(lines[1].at("run_stop_signal"), SIGINT);
  // Taken by the watcher thread, never by the thread that computes (signals.h).
  EXPECT_FALSE(lines[1].at("stop_signal_on_main_thread").get<bool>());
}

TEST(DistProcesses, LaunchForwardsSigterm) {
  Process launch({sd::test::sdtrain_binary(), "launch", "--nproc_per_node", "2", "--", "dist-check", "--dist_timeout",
                  "30", "--wait_for_stop"},
                 clean_env());
  ASSERT_TRUE(launch.wait_for_output("rank 0 waiting for a stop signal", seconds(60))) << launch.output();
  ASSERT_TRUE(launch.wait_for_output("rank 1 waiting for a stop signal", seconds(30))) << launch.output();
  launch.signal(SIGTERM);
  ASSERT_TRUE(launch.wait(seconds(30))) << launch.output();
  EXPECT_EQ(launch.exit_code(), 0) << launch.output();
  auto lines = json_lines(launch.output());
  ASSERT_EQ(lines.size(), 2u) << launch.output();
  for (const auto& l : lines) {
    EXPECT_TRUE(l.at("stopped").get<bool>()) << l;
    EXPECT_EQ(l.at("stop_signal"), SIGTERM) << l;
    EXPECT_FALSE(l.at("stop_signal_on_main_thread").get<bool>()) << l;
  }
  EXPECT_EQ(lines[0].at("steps"), lines[1].at("steps"));
}

// SIGTERM to the launcher: the ranks checkpoint and exit 143, which launch passes on without reporting a failed rank.
TEST(DistProcesses, LaunchPassesOnAStopWithoutCallingItAFailure) {
  sd::test::TempDir dir;
  Process launch(
      {sd::test::sdtrain_binary(), "launch", "--nproc_per_node", "2", "--", "train",
       "--pretrained_model_name_or_path=" + (sd::test::fixtures() / "tiny-sd1").string(), "--synthetic_data=latents",
       "--resolution=32", "--max_train_steps=100000", "--threads=1", "--output_dir=" + dir.path().string()},
      clean_env());
  ASSERT_TRUE(launch.wait_for_output("global batch", seconds(120))) << launch.output();
  launch.signal(SIGTERM);
  ASSERT_TRUE(launch.wait(seconds(60))) << launch.output();
  EXPECT_EQ(launch.exit_code(), 128 + SIGTERM) << launch.output();
  EXPECT_EQ(launch.output().find("stopping the other"), std::string::npos) << launch.output();
  bool checkpointed = false;
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    checkpointed = checkpointed || e.path().filename().string().rfind("checkpoint-", 0) == 0;
  EXPECT_TRUE(checkpointed) << launch.output();
}

TEST(DistProcesses, LaunchStopsTheRestWhenOneRankDies) {
  const double timeout = 30;
  auto r = sd::test::run_process({sd::test::sdtrain_binary(), "launch", "--nproc_per_node", "3", "--", "dist-check",
                                  "--dist_timeout", "30", "--fault_rank", "2", "--die_after_ms", "200"},
                                 seconds(60), clean_env());
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.output;
  EXPECT_NE(r.output.find("sdtrain launch: local rank 2 (pid "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("was killed by signal 9"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, timeout) << r.output;
}

TEST(DistProcesses, LaunchEscalatesToSigkill) {
  // Rank 1 hangs with a SIGTERM handler installed (so SIGTERM alone does not end it); rank 0 fails after the
  // 2 s timeout; launch then sends SIGTERM, and SIGKILL after the 1 s grace period.
  auto r = sd::test::run_process({sd::test::sdtrain_binary(), "launch", "--nproc_per_node", "2", "--grace_period", "1",
                                  "--", "dist-check", "--dist_timeout", "2", "--hang", "--wait_for_stop"},
                                 seconds(60), clean_env());
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(sd::test::rank_error(0) + "rank 1 did not reach"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("local rank 0 (pid "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("sending SIGKILL"), std::string::npos) << r.output;
}

TEST(DistProcesses, LaunchRejectsBadUse) {
  auto r = sd::test::run_process({sd::test::sdtrain_binary(), "launch", "--nproc_per_node", "0", "--", "dist-check"},
                                 seconds(30), clean_env());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--nproc_per_node must be in 1..1024"), std::string::npos) << r.output;
  // A typo in the subcommand: one line from the launcher, no rank started.
  EXPECT_TRUE(sd::test::is_one_line_error(
      sd::test::run_command(sd::test::sdtrain_binary() + " launch --nproc_per_node 2 -- trian"),
      "launch: unknown command 'trian' (expected one of: init, "));
  // A subcommand that fails in every rank: the launcher names the first and exits with its code.
  r = sd::test::run_process(
      {sd::test::sdtrain_binary(), "launch", "--nproc_per_node", "2", "--", "dist-check", "--dist_timeout", "-1"},
      seconds(30), clean_env());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--dist_timeout must be a number of seconds above 0 and below 10000000, got -1"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("sdtrain launch: local rank "), std::string::npos) << r.output;
}

TEST(DistProcesses, HelpShowsEveryFlagWithItsDefault) {
  auto launch = sd::test::run_process({sd::test::sdtrain_binary(), "launch", "--help"}, seconds(30));
  EXPECT_EQ(launch.exit_code, 0);
  for (const char* s : {"--nproc_per_node,--nproc-per-node INT=1", "--master_port,--master-port INT=0",
                        "--grace_period,--grace-period FLOAT=10", "command TEXT ... REQUIRED"})
    EXPECT_NE(launch.output.find(s), std::string::npos) << s << "\n" << launch.output;
  auto check = sd::test::run_process({sd::test::sdtrain_binary(), "dist-check", "--help"}, seconds(30));
  EXPECT_EQ(check.exit_code, 0);
  for (const char* s :
       {"--dist_timeout,--dist-timeout FLOAT=300", "--dist_iface,--dist-iface TEXT", "--threads INT:0..1024=0",
        "--size_mb,--size-mb FLOAT=1", "Test-only", "--die_after_ms INT=-1", "--hang", "--fault_rank INT=-1"})
    EXPECT_NE(check.output.find(s), std::string::npos) << s << "\n" << check.output;
}

}  // namespace
}  // namespace sd::dist
