// How many intra-op threads this rank should use: the flag; else, when a launcher bound this rank to a subset of
// the CPUs, that subset; else the machine's CPUs divided by the ranks sharing it (so `-ppn 2` on 2 cores gives
// 1 thread each). The caller applies it with at::set_num_threads.
#pragma once
#include <optional>

#include <string>

#include "dist/communicator.h"
#include "dist/rendezvous.h"

namespace sd::dist {

// CPUs in this process's affinity mask (what taskset, Slurm's cgroups/cpusets and mpirun binding give it).
int affinity_core_count();

int threads_for_rank(std::optional<int> flag, const DistEnv& env);

// What ranks must share to count as one machine (one kernel, /dev/shm, pid and network namespace); a rank that
// cannot read it gets an identity of its own ("unknown (rank r)").
std::string machine_identity(int rank);

// The same after the rendezvous, with the ranks sharing this machine counted rather than read from the launcher:
// torchrun-style variables set by hand or by Kubeflow often lack LOCAL_WORLD_SIZE, and every rank of a machine then
// took all of its CPUs (2 ranks x 2 threads on 2 cores ran 8x slower). One all_gather.
int threads_for_rank_among_peers(std::optional<int> flag, const DistEnv& env, Communicator& comm);

}  // namespace sd::dist
