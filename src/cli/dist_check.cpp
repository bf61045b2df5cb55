// `sdtrain dist-check`: rendezvous with the other ranks under whatever launcher started this process, run each
// collective once and print one JSON line per rank, so a user can check a cluster (and its network) before
// training. Also the workhorse of the multi-process tests, hence its test-only fault-injection flags.
#include <ATen/Parallel.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/flags.h"
#include "core/threads.h"
#include "core/error.h"
#include "dist/communicator.h"
#include "dist/rendezvous.h"
#include "dist/signals.h"
#include "dist/threads.h"

namespace sd::cli {
namespace {

struct DistCheckOptions {
  double dist_timeout = 300;
  std::string dist_iface;
  std::string dist_transport = "auto";
  int threads = 0;
  double size_mb = 1;
  // Test-only fault injection.
  int fault_rank = -1;
  int die_after_ms = -1;
  bool hang = false;
  bool wait_for_stop = false;
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int run_dist_check(const DistCheckOptions& o) {
  dist::DistEnv env = dist::detect_dist_env();
  dist::CommOptions copts;
  copts.timeout = dist::timeout_from_seconds(o.dist_timeout, "--dist_timeout");
  copts.iface = o.dist_iface;
  copts.transport = o.dist_transport;
  SD_CHECK(o.size_mb > 0 && o.size_mb <= 4096, "--size_mb must be in (0, 4096], got {}", o.size_mb);
  if (o.wait_for_stop) dist::install_stop_signal_handlers();
  const int fault_rank = o.fault_rank >= 0 ? o.fault_rank : env.world_size - 1;
  const bool faulty = env.rank == fault_rank;

  auto t0 = Clock::now();
  auto comm = dist::make_communicator(env, copts);
  double rendezvous_s = seconds_since(t0);
  const int threads =
      dist::threads_for_rank_among_peers(o.threads > 0 ? std::optional<int>(o.threads) : std::nullopt, env, *comm);
  set_compute_threads(threads);

  // Sum of arange(n) * (rank + 1) over ranks is arange(n) * W(W+1)/2: exact in float32 for these sizes.
  const int64_t w = env.world_size;
  const int64_t n = std::max<int64_t>(1, static_cast<int64_t>(o.size_mb * (1 << 20) / 4 / w)) * w;
  const at::Tensor pattern = at::arange(n, at::kFloat).remainder_(4096);
  const at::Tensor expected = pattern * static_cast<float>(w * (w + 1) / 2);
  at::Tensor x = pattern * static_cast<float>(env.rank + 1);
  std::vector<at::Tensor> list{x};
  auto t1 = Clock::now();
  comm->allreduce_sum(list);
  double allreduce_s = seconds_since(t1);
  bool allreduce_ok = at::equal(x, expected);

  // The sharded optimizer's collectives: each rank's chunk of the sum, then every rank's chunk everywhere.
  const int64_t chunk = n / w;
  at::Tensor ring = pattern * static_cast<float>(env.rank + 1);
  t1 = Clock::now();
  comm->reduce_scatter_sum_async(ring)->wait();
  double reduce_scatter_s = seconds_since(t1);
  bool reduce_scatter_ok =
      at::equal(ring.narrow(0, env.rank * chunk, chunk), expected.narrow(0, env.rank * chunk, chunk));
  t1 = Clock::now();
  comm->all_gather_async(ring)->wait();
  double ring_all_gather_s = seconds_since(t1);
  bool ring_all_gather_ok = at::equal(ring, expected);

  if (faulty && o.die_after_ms >= 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(o.die_after_ms));
    raise(SIGKILL);
  }
  if (faulty && o.hang)
    while (true) std::this_thread::sleep_for(std::chrono::seconds(1));

  at::Tensor b = at::full({16}, static_cast<float>(env.rank));
  comm->broadcast(b, 0);
  bool broadcast_ok = at::equal(b, at::zeros({16}));
  auto gathered = comm->all_gather({env.rank, env.local_rank});
  bool gather_ok = static_cast<int64_t>(gathered.size()) == 2 * w;
  for (int64_t r = 0; gather_ok && r < w; ++r) gather_ok = gathered[2 * r] == r;
  comm->barrier();

  // Test-only: poll for a stop request once per "step" as a training loop would; all ranks stop at one step.
  int64_t steps = 0;
  bool stopped = false;
  if (o.wait_for_stop) {
    std::fprintf(stderr, "dist-check: rank %d waiting for a stop signal (pid %d)\n", env.rank,
                 static_cast<int>(getpid()));
    std::fflush(stderr);
    while (!(stopped = dist::any_rank_stopping(*comm))) {
      ++steps;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  char host[256] = {};
  gethostname(host, sizeof host - 1);
  nlohmann::json line = {{"rank", env.rank},
                         {"world_size", env.world_size},
                         {"local_rank", env.local_rank},
                         {"local_world_size", env.local_world_size},
                         {"launcher", env.launcher},
                         {"master", fmt::format("{}:{}", env.master_addr, env.master_port)},
                         {"host", host},
                         {"backend", comm->backend_name()},
                         {"ring_transport", comm->ring_transport()},
                         {"threads", threads},
                         {"allreduce_ok", allreduce_ok},
                         {"broadcast_ok", broadcast_ok},
                         {"all_gather_ok", gather_ok},
                         {"rendezvous_s", rendezvous_s},
                         {"allreduce_mb", n * 4.0 / (1 << 20)},
                         {"allreduce_s", allreduce_s},
                         {"reduce_scatter_ok", reduce_scatter_ok},
                         {"reduce_scatter_s", reduce_scatter_s},
                         {"ring_all_gather_ok", ring_all_gather_ok},
                         {"ring_all_gather_s", ring_all_gather_s}};
  if (o.wait_for_stop) {
    line["stopped"] = stopped;
    line["steps"] = steps;
    line["stop_signal"] = dist::stop_signal();
    line["run_stop_signal"] = dist::run_stop_signal();
    line["stop_signal_on_main_thread"] = dist::stop_signal_ran_on_main_thread();
  }
  std::printf("%s\n", line.dump().c_str());
  std::fflush(stdout);
  SD_CHECK(allreduce_ok && reduce_scatter_ok && ring_all_gather_ok && broadcast_ok && gather_ok,
           "dist-check: rank {} got wrong collective results (allreduce {}, reduce-scatter {}, ring all-gather {}, "
           "broadcast {}, all_gather {})",
           env.rank, allreduce_ok, reduce_scatter_ok, ring_all_gather_ok, broadcast_ok, gather_ok);
  return 0;
}

}  // namespace

void add_dist_check(CLI::App& app, std::function<int()>& chosen) {
  auto o = std::make_shared<DistCheckOptions>();
  CLI::App* cmd = app.add_subcommand(
      "dist-check",
      "Check a distributed setup: rendezvous under the launcher (mpirun, srun, torchrun-style variables, sdtrain "
      "launch), run each collective once, print one JSON line per rank");
  cmd->add_option("--dist_timeout,--dist-timeout", o->dist_timeout,
                  "Seconds to wait for other ranks (joining, each collective) before failing, naming the rank")
      ->capture_default_str();
  cmd->add_option("--dist_iface,--dist-iface", o->dist_iface,
                  "Network interface(s) for collectives, comma-separated (default: GLOO_SOCKET_IFNAME, else the "
                  "interface that reaches MASTER_ADDR)")
      ->capture_default_str();
  dist_transport_flag(cmd, o->dist_transport)->capture_default_str();
  cmd->add_option("--threads", o->threads, "Intra-op threads (0: cores of this process / ranks on this machine)")
      ->check(in_range(0, 1024))
      ->capture_default_str();
  cmd->add_option("--size_mb,--size-mb", o->size_mb, "Size of each collective's tensor in MiB")->capture_default_str();
  const char* test_group = "Test-only (fault injection; do not use for real checks)";
  cmd->add_option("--fault_rank", o->fault_rank, "Rank the fault flags apply to (-1: the last rank)")
      ->capture_default_str()
      ->group(test_group);
  cmd->add_option("--die_after_ms", o->die_after_ms,
                  "After the first allreduce, the fault rank kills itself (SIGKILL) after this many ms (-1: never)")
      ->capture_default_str()
      ->group(test_group);
  cmd->add_flag("--hang", o->hang, "After the first allreduce, the fault rank stops calling collectives forever")
      ->capture_default_str()
      ->group(test_group);
  cmd->add_flag("--wait_for_stop", o->wait_for_stop,
                "After the checks, loop until any rank gets SIGTERM/SIGINT; all ranks stop at the same step")
      ->capture_default_str()
      ->group(test_group);
  cmd->callback([o, &chosen] { chosen = [o] { return run_dist_check(*o); }; });
}

}  // namespace sd::cli
