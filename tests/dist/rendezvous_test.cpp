// detect_dist_env for every launcher form, Slurm's list syntaxes, and threads_for_rank.
#include <gtest/gtest.h>
#include <sched.h>

#include <thread>

#include "core/error.h"
#include "dist/rendezvous.h"
#include "dist/threads.h"
#include "test_util.h"

namespace sd::dist {
namespace {

using Env = std::map<std::string, std::string>;

// Expects sd::Error whose message contains every one of `parts`.
void expect_error(const Env& env, std::initializer_list<std::string> parts) {
  try {
    detect_dist_env(env);
    ADD_FAILURE() << "expected sd::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

TEST(DistEnv, NoLauncherIsASingleProcess) {
  DistEnv d = detect_dist_env(Env{{"HOME", "/root"}});
  EXPECT_EQ(d.rank, 0);
  EXPECT_EQ(d.world_size, 1);
  EXPECT_EQ(d.local_rank, 0);
  EXPECT_EQ(d.local_world_size, 1);
  EXPECT_EQ(d.launcher, "single");
  EXPECT_EQ(d.master_addr, "127.0.0.1");
  EXPECT_EQ(d.master_port, 29500);
  EXPECT_FALSE(d.distributed());
}

TEST(DistEnv, TorchrunStyleVariables) {
  DistEnv d = detect_dist_env(Env{{"RANK", "5"},
                                  {"WORLD_SIZE", "8"},
                                  {"LOCAL_RANK", "1"},
                                  {"LOCAL_WORLD_SIZE", "4"},
                                  {"MASTER_ADDR", "node7"},
                                  {"MASTER_PORT", "1234"},
                                  {"TORCHELASTIC_RUN_ID", "x"}});
  EXPECT_EQ(d.rank, 5);
  EXPECT_EQ(d.world_size, 8);
  EXPECT_EQ(d.local_rank, 1);
  EXPECT_EQ(d.local_world_size, 4);
  EXPECT_EQ(d.master_addr, "node7");
  EXPECT_EQ(d.master_port, 1234);
  EXPECT_EQ(d.launcher, "torchrun");
}

TEST(DistEnv, KubeflowPyTorchJobSetsNoLocalVariables) {
  // One process per pod: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT only.
  DistEnv d = detect_dist_env(
      Env{{"RANK", "2"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "job-master-0"}, {"MASTER_PORT", "23456"}});
  EXPECT_EQ(d.rank, 2);
  EXPECT_EQ(d.world_size, 3);
  EXPECT_EQ(d.local_rank, 0);
  EXPECT_EQ(d.local_world_size, 1);
  EXPECT_EQ(d.master_addr, "job-master-0");
  EXPECT_EQ(d.master_port, 23456);
  EXPECT_EQ(d.launcher, "env");
}

TEST(DistEnv, SdtrainLaunchIsRecognised) {
  DistEnv d = detect_dist_env(Env{{"RANK", "1"},
                                  {"WORLD_SIZE", "2"},
                                  {"LOCAL_RANK", "1"},
                                  {"LOCAL_WORLD_SIZE", "2"},
                                  {"MASTER_ADDR", "127.0.0.1"},
                                  {"MASTER_PORT", "40000"},
                                  {"SDTRAIN_LAUNCH", "1"}});
  EXPECT_EQ(d.launcher, "sdtrain-launch");
  EXPECT_TRUE(d.single_node());
}

TEST(DistEnv, TorchrunStyleWithoutMasterAcrossMachinesIsAnError) {
  expect_error(Env{{"RANK", "1"}, {"WORLD_SIZE", "2"}}, {"MASTER_ADDR", "span machines"});
  // All ranks local: loopback.
  DistEnv d = detect_dist_env(Env{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}});
  EXPECT_EQ(d.master_addr, "127.0.0.1");
}

TEST(DistEnv, OpenMpiOnOneMachineUsesLoopback) {
  DistEnv d = detect_dist_env(Env{{"OMPI_COMM_WORLD_RANK", "2"},
                                  {"OMPI_COMM_WORLD_SIZE", "3"},
                                  {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}});
  EXPECT_EQ(d.rank, 2);
  EXPECT_EQ(d.world_size, 3);
  EXPECT_EQ(d.local_rank, 2);
  EXPECT_EQ(d.local_world_size, 3);
  EXPECT_EQ(d.launcher, "openmpi");
  EXPECT_EQ(d.master_addr, "127.0.0.1");
  EXPECT_EQ(d.master_port, 29500);
}

TEST(DistEnv, OpenMpiAcrossMachinesNeedsMasterAddr) {
  Env env{{"OMPI_COMM_WORLD_RANK", "3"},
          {"OMPI_COMM_WORLD_SIZE", "4"},
          {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
  expect_error(env, {"MASTER_ADDR", "-x MASTER_ADDR", "4 ranks, 2 on this one"});
  env["MASTER_ADDR"] = "10.0.0.1";
  env["MASTER_PORT"] = "29999";
  DistEnv d = detect_dist_env(env);
  EXPECT_EQ(d.master_addr, "10.0.0.1");
  EXPECT_EQ(d.master_port, 29999);
  EXPECT_EQ(d.local_rank, 1);
  EXPECT_EQ(d.local_world_size, 2);
}

TEST(DistEnv, HydraHostfileForm) {
  // mpirun.mpich -f hosts -n 3 -ppn 3 on one host.
  DistEnv d = detect_dist_env(
      Env{{"PMI_RANK", "1"}, {"PMI_SIZE", "3"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "3"}, {"PMI_FD", "6"}});
  EXPECT_EQ(d.rank, 1);
  EXPECT_EQ(d.world_size, 3);
  EXPECT_EQ(d.local_rank, 1);
  EXPECT_EQ(d.local_world_size, 3);
  EXPECT_EQ(d.launcher, "hydra");
  EXPECT_EQ(d.master_addr, "127.0.0.1");
  // The seed's form across machines, -n 3 -ppn 1: one rank per host.
  Env across{{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}, {"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "1"}};
  expect_error(across, {"MASTER_ADDR", "-genv MASTER_ADDR"});
  across["MASTER_ADDR"] = "xeon1";
  EXPECT_EQ(detect_dist_env(across).master_addr, "xeon1");
}

TEST(DistEnv, SlurmSrunAcrossNodes) {
  Env env{{"SLURM_PROCID", "5"},
          {"SLURM_NTASKS", "7"},
          {"SLURM_LOCALID", "1"},
          {"SLURM_NODEID", "2"},
          {"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"},
          {"SLURM_JOB_NODELIST", "node[01-03,07],gpu5"},
          {"SLURM_NTASKS_PER_NODE", "9"}};
  DistEnv d = detect_dist_env(env);
  EXPECT_EQ(d.rank, 5);
  EXPECT_EQ(d.world_size, 7);
  EXPECT_EQ(d.local_rank, 1);
  EXPECT_EQ(d.local_world_size, 2);  // the step's list wins over SLURM_NTASKS_PER_NODE
  EXPECT_EQ(d.launcher, "slurm");
  EXPECT_EQ(d.master_addr, "node01");
  // The last node has one task.
  env["SLURM_NODEID"] = "3";
  env["SLURM_PROCID"] = "6";
  env["SLURM_LOCALID"] = "0";
  EXPECT_EQ(detect_dist_env(env).local_world_size, 1);
  // The step's node list wins over the job's; MASTER_ADDR over both.
  env["SLURM_STEP_NODELIST"] = "gpu[5-6]";
  EXPECT_EQ(detect_dist_env(env).master_addr, "gpu5");
  env["MASTER_ADDR"] = "10.1.1.1";
  EXPECT_EQ(detect_dist_env(env).master_addr, "10.1.1.1");
}

TEST(DistEnv, SlurmUniformTasksPerNode) {
  DistEnv d = detect_dist_env(Env{{"SLURM_PROCID", "3"},
                                  {"SLURM_NTASKS", "4"},
                                  {"SLURM_LOCALID", "1"},
                                  {"SLURM_NTASKS_PER_NODE", "2"},
                                  {"SLURM_JOB_NODELIST", "c[10-11]"}});
  EXPECT_EQ(d.local_world_size, 2);
  EXPECT_EQ(d.master_addr, "c10");
}

TEST(DistEnv, SlurmOnOneNodeUsesLoopback) {
  DistEnv d = detect_dist_env(Env{{"SLURM_PROCID", "1"},
                                  {"SLURM_NTASKS", "2"},
                                  {"SLURM_LOCALID", "1"},
                                  {"SLURM_STEP_TASKS_PER_NODE", "2"},
                                  {"SLURM_JOB_NODELIST", "node42"}});
  EXPECT_EQ(d.local_world_size, 2);
  EXPECT_EQ(d.master_addr, "127.0.0.1");
}

TEST(DistEnv, InnermostLauncherWins) {
  // mpirun inside an sbatch script: the batch step's SLURM_* variables are inherited.
  Env env{{"SLURM_PROCID", "0"},
          {"SLURM_NTASKS", "1"},
          {"SLURM_JOB_NODELIST", "n1"},
          {"OMPI_COMM_WORLD_RANK", "1"},
          {"OMPI_COMM_WORLD_SIZE", "2"},
          {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
  EXPECT_EQ(detect_dist_env(env).launcher, "openmpi");
  EXPECT_EQ(detect_dist_env(env).rank, 1);
  // torchrun-style variables win over all (sdtrain launch started under mpirun).
  env["RANK"] = "0";
  env["WORLD_SIZE"] = "1";
  EXPECT_EQ(detect_dist_env(env).launcher, "env");
  EXPECT_EQ(detect_dist_env(env).world_size, 1);
}

TEST(DistEnv, MalformedValuesNameTheVariable) {
  expect_error(Env{{"RANK", "abc"}, {"WORLD_SIZE", "2"}}, {"RANK='abc'"});
  expect_error(Env{{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}, {"rank 2 is outside 0..1"});
  expect_error(Env{{"RANK", "0"}, {"WORLD_SIZE", "0"}}, {"WORLD_SIZE='0'"});
  expect_error(Env{{"RANK", "0"}}, {"WORLD_SIZE is not set"});
  expect_error(Env{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}}, {"OMPI_COMM_WORLD_LOCAL_RANK"});
  expect_error(Env{{"MASTER_PORT", "70000"}}, {"MASTER_PORT"});
  expect_error(Env{{"MASTER_PORT", "12x"}}, {"MASTER_PORT='12x'"});
  expect_error(Env{{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "3"}, {"MPI_LOCALNRANKS", "2"}},
               {"local rank 3"});
  expect_error(
      Env{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NODEID", "5"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}},
      {"SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID=5"});
}

TEST(SlurmNodelist, ExpandsRangesListsAndPadding) {
  using V = std::vector<std::string>;
  EXPECT_EQ(expand_slurm_nodelist("node[01-03,07],gpu5"), (V{"node01", "node02", "node03", "node07", "gpu5"}));
  EXPECT_EQ(expand_slurm_nodelist("a,b"), (V{"a", "b"}));
  EXPECT_EQ(expand_slurm_nodelist("single"), (V{"single"}));
  EXPECT_EQ(expand_slurm_nodelist("n[9-11]"), (V{"n9", "n10", "n11"}));
  EXPECT_EQ(expand_slurm_nodelist("n[008-010]"), (V{"n008", "n009", "n010"}));
  EXPECT_EQ(expand_slurm_nodelist("r[1-2]n[1,3]"), (V{"r1n1", "r1n3", "r2n1", "r2n3"}));
  EXPECT_EQ(expand_slurm_nodelist("x[1]-ib,y"), (V{"x1-ib", "y"}));
  EXPECT_EQ(expand_slurm_nodelist("node-[1-2].cluster"), (V{"node-1.cluster", "node-2.cluster"}));
}

TEST(SlurmNodelist, RejectsMalformedLists) {
  for (const char* bad : {"", "node[01-", "node]", "node[3-1]", "node[a-b]", "node[]", "a,,b", "n[1,,2]", "n[[1]]"}) {
    EXPECT_THROW(expand_slurm_nodelist(bad), Error) << bad;
  }
  try {
    expand_slurm_nodelist("node[3-1]", "SLURM_STEP_NODELIST");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_STEP_NODELIST='node[3-1]'"), std::string::npos) << e.what();
  }
}

TEST(SlurmTasksPerNode, ExpandsRepeats) {
  EXPECT_EQ(expand_slurm_tasks_per_node("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(expand_slurm_tasks_per_node("4"), (std::vector<int>{4}));
  EXPECT_EQ(expand_slurm_tasks_per_node("1,3(x2)"), (std::vector<int>{1, 3, 3}));
  for (const char* bad : {"", "2(x)", "2(3)", "x", "2(x0)"})
    EXPECT_THROW(expand_slurm_tasks_per_node(bad), Error) << bad;
}

TEST(ThreadsForRank, FlagElseAffinityCoresPerLocalRank) {
  DistEnv d;
  EXPECT_EQ(threads_for_rank(3, d), 3);
  EXPECT_THROW(threads_for_rank(0, d), Error);
  // nproc(1) counts the CPUs in the affinity mask, independently of our code.
  auto r = sd::test::run_command("nproc");
  ASSERT_EQ(r.exit_code, 0);
  int cores = std::stoi(r.output);
  EXPECT_EQ(affinity_core_count(), cores);
  d.local_world_size = 1;
  d.world_size = 4;
  EXPECT_EQ(threads_for_rank(std::nullopt, d), cores);
  d.local_world_size = 2;
  EXPECT_EQ(threads_for_rank(std::nullopt, d), std::max(1, cores / 2));
  d.local_world_size = 4 * cores;  // more ranks than cores: still one thread each
  EXPECT_EQ(threads_for_rank(std::nullopt, d), 1);
  // A launcher's binding (taskset, mpirun --bind-to core, Slurm cpusets) narrows the mask: affinity is per
  // thread, so narrow it in a scratch thread.
  int pinned_count = -1;
  std::thread([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu() >= 0 ? sched_getcpu() : 0, &one);
    if (sched_setaffinity(0, sizeof one, &one) == 0) pinned_count = affinity_core_count();
  }).join();
  EXPECT_EQ(pinned_count, 1);
}

}  // namespace
}  // namespace sd::dist
