// The deploy/ examples, exercised for both workloads (the seed's textual inversion and sharded UNet training): the
// MPI scripts under MPICH's Hydra and Open MPI, the Slurm batch scripts under a stand-in srun that sets what srun
// sets, and the PyTorchJob manifests' arguments with the variables the training operator sets.
#include <algorithm>
#include <fstream>
#include <regex>

#include "dist/store_listen.h"
#include "io/atomic_file.h"
#include "process_util.h"
#include "test_util.h"

namespace sd {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

fs::path deploy_dir() { return fs::path(SDTRAIN_FIXTURES).parent_path().parent_path() / "deploy"; }

// One workload's examples: their file names, the subcommand, and what a finished run leaves in the output folder.
struct Workload {
  std::string name;        // the examples' file stem: textual-inversion, unet-training
  std::string subcommand;  // what the PyTorchJob runs
  std::string result;      // a file the run writes last
};

std::string workload_name(const ::testing::TestParamInfo<Workload>& info) {
  std::string name = info.param.name;
  name.erase(std::remove(name.begin(), name.end(), '-'), name.end());
  return name;
}

class Deploy : public ::testing::TestWithParam<Workload> {
 protected:
  void SetUp() override {
    auto r =
        sd::test::run_process({sd::test::sdtrain_binary(), "init", "--preset", "tiny", "--out", model().string()}, 60s);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    sd::test::write_captioned_images(data(), 4);
    std::ofstream(hosts()) << "localhost\n";
  }
  fs::path model() const { return dir_.path() / "model"; }
  fs::path data() const { return dir_.path() / "data"; }
  fs::path out() const { return dir_.path() / "out"; }
  fs::path hosts() const { return dir_.path() / "hosts"; }
  // Small enough for CI; these flags come last, so they win over the examples' production values.
  std::vector<std::string> small_for_workload() const {
    std::vector<std::string> flags = {"--resolution=32", "--max_train_steps=2", "--train_batch_size=1", "--threads=1",
                                      "--dist_timeout=60"};
    // UNet training's examples set a global batch; textual inversion's use one image per rank already.
    if (GetParam().subcommand == "train") flags.push_back("--global_batch_size=2");
    return flags;
  }
  std::map<std::string, std::string> env() const {
    std::string extra;
    for (const auto& f : small_for_workload()) extra += f + " ";
    return {{"MODEL", model().string()},
            {"DATA", data().string()},
            {"OUT", out().string()},
            {"HOSTS", hosts().string()},
            {"SDTRAIN", sd::test::sdtrain_binary()},
            {"EXTRA_ARGS", extra},
            {"MASTER_ADDR", "127.0.0.1"},
            {"MASTER_PORT", std::to_string(dist::find_free_port())}};
  }
  void expect_trained(const sd::test::ProcessResult& r) const {
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(fs::exists(out() / GetParam().result)) << r.output;
  }
  fs::path example(const std::string& folder, const std::string& extension) const {
    return deploy_dir() / folder / (GetParam().name + extension);
  }
  sd::test::TempDir dir_;
};

TEST_P(Deploy, MpiScriptUnderHydra) {
  if (!sd::test::have_program("mpirun.mpich")) GTEST_SKIP() << "mpirun.mpich not installed (Debian: mpich)";
  auto e = env();
  e["MPIRUN"] = "mpirun.mpich";
  e["RANKS"] = "2";
  e["PER_NODE"] = "2";
  expect_trained(sd::test::run_process({example("mpi", ".sh").string(), "hydra"}, 120s, e));
}

TEST_P(Deploy, MpiScriptUnderOpenMpi) {
  if (!sd::test::have_program("mpirun.openmpi")) GTEST_SKIP() << "mpirun.openmpi not installed (Debian: openmpi-bin)";
  auto e = env();
  e["MPIRUN"] = "mpirun.openmpi";
  e["RANKS"] = "2";
  e["PER_NODE"] = "2";
  e["OMPI_ALLOW_RUN_AS_ROOT"] = "1";
  e["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1";
  e["OMPI_MCA_rmaps_base_oversubscribe"] = "1";
  expect_trained(sd::test::run_process({example("mpi", ".sh").string(), "openmpi"}, 120s, e));
}

TEST_P(Deploy, SlurmBatchScript) {
  // A stand-in srun: starts SLURM_NTASKS tasks here with the variables the real one gives each task.
  const fs::path bin = dir_.path() / "bin";
  fs::create_directories(bin);
  io::write_text_file(bin / "srun", R"(#!/usr/bin/env bash
while [[ $1 == --* ]]; do shift; done
pids=()
for ((i = 0; i < SLURM_NTASKS; i++)); do
  SLURM_PROCID=$i SLURM_LOCALID=$i SLURM_STEP_TASKS_PER_NODE=$SLURM_NTASKS SLURM_NTASKS_PER_NODE=$SLURM_NTASKS "$@" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
)");
  fs::permissions(bin / "srun", fs::perms::owner_all);
  fs::create_symlink(sd::test::sdtrain_binary(), bin / "sdtrain");
  auto e = env();
  e.erase("MASTER_ADDR");  // under Slurm the master is the first host of the node list
  e["PATH"] = bin.string() + ":" + std::getenv("PATH");
  e["SLURM_NTASKS"] = "2";
  e["SLURM_JOB_NODELIST"] = "localhost";
  expect_trained(sd::test::run_process({"bash", example("slurm", ".sbatch").string()}, 120s, e));
}

TEST_P(Deploy, PyTorchJobArgumentsWithOperatorVariables) {
  // The manifest's container args, run as the operator runs them: one process per replica, RANK etc. set.
  std::ifstream manifest(deploy_dir() / "kubernetes" / ("pytorchjob-" + GetParam().name + ".yaml"));
  std::vector<std::string> args = {sd::test::sdtrain_binary(), GetParam().subcommand};
  std::string line;
  const std::regex arg_line(R"(^\s+- (--\S+)\s*$)");
  std::smatch m;
  while (std::getline(manifest, line))
    if (std::regex_match(line, m, arg_line)) args.push_back(m[1]);
  ASSERT_GT(args.size(), 10u);
  for (const std::string& extra : {"--pretrained_model_name_or_path=" + model().string(),
                                   "--train_data_dir=" + data().string(), "--output_dir=" + out().string()})
    args.push_back(extra);
  for (const auto& f : small_for_workload()) args.push_back(f);
  const std::string port = std::to_string(dist::find_free_port());
  std::vector<std::unique_ptr<sd::test::Process>> pods;
  for (int rank = 0; rank < 2; ++rank)
    pods.push_back(std::make_unique<sd::test::Process>(
        args,
        std::map<std::string, std::string>{
            {"RANK", std::to_string(rank)}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}}));
  std::vector<sd::test::Process*> all = {pods[0].get(), pods[1].get()};
  ASSERT_TRUE(sd::test::wait_all(all, 120s));
  for (auto& pod : pods) EXPECT_EQ(pod->exit_code(), 0) << pod->output();
  EXPECT_TRUE(fs::exists(out() / GetParam().result));
}

INSTANTIATE_TEST_SUITE_P(Workloads, Deploy,
                         ::testing::Values(Workload{"textual-inversion", "textual-inversion", "model_index.json"},
                                           Workload{"unet-training", "train", "unet/config.json"}),
                         workload_name);

}  // namespace
}  // namespace sd
