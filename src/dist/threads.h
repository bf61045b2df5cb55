// How many intra-op threads this rank should use: the flag; else, when a launcher bound this rank to a subset of
// the CPUs, that subset; else the machine's CPUs divided by the ranks sharing it (so `-ppn 2` on 2 cores gives
// 1 thread each). The caller applies it with at::set_num_threads.
#pragma once
#include <optional>

#include "dist/rendezvous.h"

namespace sd::dist {

// CPUs in this process's affinity mask (what taskset, Slurm's cgroups/cpusets and mpirun binding give it).
int affinity_core_count();

int threads_for_rank(std::optional<int> flag, const DistEnv& env);

}  // namespace sd::dist
