// Where this process sits in a distributed job, read from whatever launcher started it (mpirun of Open MPI or
// MPICH/Intel MPI Hydra, Slurm srun, torchrun-style variables, `sdtrain launch`), with no flag needed.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace sd::dist {

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;                     // index among the ranks on this machine
  int local_world_size = 1;               // ranks on this machine
  std::string master_addr = "127.0.0.1";  // host of rank 0, where the rendezvous store listens
  int master_port = 29500;
  // "single", "openmpi", "hydra", "slurm", "torchrun", "sdtrain-launch" or "env" (RANK/WORLD_SIZE set by
  // something else, e.g. Kubeflow's PyTorchJob).
  std::string launcher = "single";

  bool distributed() const { return world_size > 1; }
  // All ranks on this machine: loopback suffices.
  bool single_node() const { return local_world_size == world_size; }
};

// Pure function of the environment so every launcher form is unit-testable. Precedence when several sets of
// variables are present: torchrun-style (RANK, WORLD_SIZE) > Open MPI > Hydra > Slurm, i.e. the innermost
// launcher wins (mpirun inside an sbatch script still sees the allocation's SLURM_* variables).
// Throws sd::Error naming the variable when a value is malformed, and when ranks span machines without a known
// master address.
DistEnv detect_dist_env(const std::map<std::string, std::string>& env);

// The same, from this process's environment.
DistEnv detect_dist_env();
std::map<std::string, std::string> current_environment();

// Slurm's compressed host list: "node[01-03,07],gpu5" -> node01 node02 node03 node07 gpu5. Several bracket
// groups in one name expand as a product ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2). `what` names the variable in
// errors.
std::vector<std::string> expand_slurm_nodelist(const std::string& list, const std::string& what = "SLURM_JOB_NODELIST");

// Slurm's per-node task counts: "2(x3),1" -> 2 2 2 1.
std::vector<int> expand_slurm_tasks_per_node(const std::string& list,
                                             const std::string& what = "SLURM_STEP_TASKS_PER_NODE");

// One line for logs: "rank 1/4 (local 1/2) via openmpi, master 10.0.0.1:29500".
std::string describe(const DistEnv& env);

}  // namespace sd::dist
