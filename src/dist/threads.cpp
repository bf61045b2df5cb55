#include "dist/threads.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <functional>

#include "core/error.h"

namespace sd::dist {

int affinity_core_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

int threads_for_rank(std::optional<int> flag, const DistEnv& env) {
  if (flag) {
    SD_CHECK(*flag >= 1, "--threads must be >= 1, got {}", *flag);
    return *flag;
  }
  // A launcher that binds each rank to its own cores (srun --cpus-per-task, mpirun --bind-to) leaves fewer CPUs in
  // the affinity mask than the machine has: those are this rank's alone. Otherwise the ranks share the machine.
  const int mine = affinity_core_count();
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  if (online > 0 && mine < online) return mine;
  return std::max(1, mine / std::max(1, env.local_world_size));
}

// What ranks must share to exchange messages through shared memory: the running kernel (boot id), the mount
// namespace (one /dev/shm), the pid namespace (a peer's pid tells whether it still runs) and the network namespace
// (ranks in separate ones stand for separate machines, as in the multi-machine tests). A rank that cannot read them
// counts as a machine of its own.
std::string machine_identity(int rank) {
  const std::string unknown = fmt::format("unknown (rank {})", rank);
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string identity;
  // Namespace numbers repeat across machines (every kernel's initial ones are the same): without the boot id they
  // tell nothing.
  if (!std::getline(boot, identity) || identity.empty()) return unknown;
  for (const char* ns : {"/proc/self/ns/mnt", "/proc/self/ns/pid", "/proc/self/ns/net"}) {
    char target[256] = {};
    if (readlink(ns, target, sizeof target - 1) <= 0) return unknown;
    identity += std::string(" ") + target;
  }
  return identity;
}

int threads_for_rank_among_peers(std::optional<int> flag, const DistEnv& env, Communicator& comm) {
  if (flag || comm.world_size() == 1) return threads_for_rank(flag, env);
  const auto mine = static_cast<int64_t>(std::hash<std::string>{}(machine_identity(comm.rank())));
  const std::vector<int64_t> machines = comm.all_gather({mine});
  DistEnv counted = env;
  counted.local_world_size = static_cast<int>(std::count(machines.begin(), machines.end(), mine));
  return threads_for_rank(flag, counted);
}

}  // namespace sd::dist
