#include "dist/threads.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>

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

}  // namespace sd::dist
