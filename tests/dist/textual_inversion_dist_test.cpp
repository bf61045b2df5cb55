// Data-parallel textual inversion: N ranks give the embedding that 1 rank with accumulation gives on the same
// global batch; the seed deployment's Hydra command line runs; a lost rank and SIGTERM are handled.
#include <csignal>
#include <fstream>
#include <thread>

#include "dist/store_listen.h"
#include "io/safetensors.h"
#include "process_util.h"
#include "test_util.h"

namespace sd {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class TextualInversionDist : public ::testing::Test {
 protected:
  void SetUp() override {
    auto r = sd::test::run_process({sd::test::sdtrain_binary(), "init", "--preset", "tiny", "--seed", "5", "--out",
                                    (dir_.path() / "model").string()},
                                   60s);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (int i = 0; i < 2; ++i)
      sd::test::write_pattern_png(dir_.path() / "images" / ("img" + std::to_string(i) + ".png"), 48, 40 + 8 * i, 5 + i);
  }

  // The seed deployment's textual_inversion.py flags on the tiny model.
  std::vector<std::string> train(const fs::path& out, int accumulation, int steps,
                                 const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> args = {sd::test::sdtrain_binary(),
                                     "textual-inversion",
                                     "--pretrained_model_name_or_path=" + (dir_.path() / "model").string(),
                                     "--train_data_dir=" + (dir_.path() / "images").string(),
                                     "--learnable_property=object",
                                     "--placeholder_token=<dicoo>",
                                     "--initializer_token=toy",
                                     "--resolution=32",
                                     "--train_batch_size=1",
                                     "--seed=7",
                                     "--gradient_accumulation_steps=" + std::to_string(accumulation),
                                     "--max_train_steps=" + std::to_string(steps),
                                     "--learning_rate=2.0e-03",
                                     "--scale_lr",
                                     "--lr_scheduler=constant",
                                     "--lr_warmup_steps=0",
                                     "--output_dir=" + out.string(),
                                     "--threads=1",
                                     "--dist_timeout=30"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  at::Tensor learned(const fs::path& out) const {
    return io::load_safetensors(out / "learned_embeds.safetensors").at("<dicoo>");
  }

  sd::test::TempDir dir_;
};

// Ranks sum their gradients in a different order than one rank accumulating them, so results agree only to
// float32 reduction noise, which AdamW amplifies for elements whose gradient is near zero (it divides each
// element by its own magnitude): observed up to 3e-6 of max|row| after 4 steps with 3 ranks. A wrong sample or
// a missing rank's gradient moves elements by ~lr = 4e-3, i.e. ~6e-2 of max|row| here.
constexpr double kReductionTolerance = 2e-5;

TEST_F(TextualInversionDist, TwoAndThreeRanksMatchOneRankWithAccumulation) {
  for (int ranks : {2, 3}) {
    const fs::path single = dir_.path() / ("single" + std::to_string(ranks));
    const fs::path multi = dir_.path() / ("multi" + std::to_string(ranks));
    auto a = sd::test::run_process(train(single, ranks, 4), 120s);
    ASSERT_EQ(a.exit_code, 0) << a.output;
    auto b = sd::test::run_process(sd::test::under_launch(ranks, train(multi, 1, 4)), 120s);
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_TRUE(sd::test::close_rel_max(learned(multi), learned(single), kReductionTolerance)) << ranks << " ranks";
    EXPECT_FALSE(
        at::equal(learned(single), io::load_safetensors(dir_.path() / "model" / "text_encoder" / "model.safetensors")
                                       .at("text_model.embeddings.token_embedding.weight")
                                       .narrow(0, 5988, 1)))
        << "training moved the embedding away from the initializer";
  }
}

TEST_F(TextualInversionDist, SeedDeploymentHydraCommandLine) {
  if (!sd::test::have_program("mpirun.mpich")) GTEST_SKIP() << "mpirun.mpich not installed (Debian: mpich)";
  const fs::path hosts = dir_.path() / "hosts";
  std::ofstream(hosts) << "localhost\n";
  // A free port: the default 29500 could meet another test's job under ctest -j.
  std::vector<std::string> args = {
      "mpirun.mpich", "-f", hosts.string(), "-n",          "2",
      "-ppn",         "2",  "-genv",        "MASTER_PORT", std::to_string(dist::find_free_port())};
  auto command = train(dir_.path() / "hydra", 1, 3);
  args.insert(args.end(), command.begin(), command.end());
  auto r = sd::test::run_process(args, 120s);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto single = sd::test::run_process(train(dir_.path() / "hydra-single", 2, 3), 120s);
  ASSERT_EQ(single.exit_code, 0) << single.output;
  EXPECT_TRUE(sd::test::close_rel_max(learned(dir_.path() / "hydra"), learned(dir_.path() / "hydra-single"),
                                      kReductionTolerance));
}

TEST_F(TextualInversionDist, OpenMpiRuns) {
  if (!sd::test::have_program("mpirun.openmpi")) GTEST_SKIP() << "mpirun.openmpi not installed (Debian: openmpi-bin)";
  std::vector<std::string> args = {"mpirun.openmpi",
                                   "--allow-run-as-root",
                                   "--oversubscribe",
                                   "-n",
                                   "2",
                                   "-x",
                                   "MASTER_PORT=" + std::to_string(dist::find_free_port())};
  auto command = train(dir_.path() / "ompi", 1, 2);
  args.insert(args.end(), command.begin(), command.end());
  auto r = sd::test::run_process(args, 120s);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir_.path() / "ompi" / "learned_embeds.safetensors"));
}

TEST_F(TextualInversionDist, KilledRankEndsTheOthersNamingIt) {
  const fs::path out = dir_.path() / "killed";
  const int port = dist::find_free_port();
  std::vector<std::unique_ptr<sd::test::Process>> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.push_back(
        std::make_unique<sd::test::Process>(train(out, 1, 100000, {"--dist_timeout=20"}),
                                            std::map<std::string, std::string>{{"RANK", std::to_string(r)},
                                                                               {"WORLD_SIZE", "2"},
                                                                               {"LOCAL_RANK", std::to_string(r)},
                                                                               {"LOCAL_WORLD_SIZE", "2"},
                                                                               {"MASTER_ADDR", "127.0.0.1"},
                                                                               {"MASTER_PORT", std::to_string(port)}}));
  // Wait until training runs (metrics appear), then kill rank 1 outright.
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!fs::exists(out / "logs" / "metrics.jsonl") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(fs::exists(out / "logs" / "metrics.jsonl")) << ranks[0]->output();
  ranks[1]->signal(SIGKILL);
  ASSERT_TRUE(ranks[0]->wait(40s)) << "rank 0 must not hang";
  EXPECT_NE(ranks[0]->exit_code(), 0);
  EXPECT_LT(ranks[0]->seconds(), 60.0);
  EXPECT_NE(ranks[0]->output().find("rank 1"), std::string::npos) << ranks[0]->output();
}

TEST_F(TextualInversionDist, SigtermWritesACheckpointThatResumes) {
  const fs::path out = dir_.path() / "term";
  sd::test::Process run(sd::test::under_launch(2, train(out, 1, 100000)));
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!fs::exists(out / "logs" / "metrics.jsonl") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(fs::exists(out / "logs" / "metrics.jsonl")) << run.output();
  run.signal(SIGTERM);
  ASSERT_TRUE(run.wait(60s)) << run.output();
  EXPECT_NE(run.output().find("resume with --resume_from_checkpoint latest"), std::string::npos) << run.output();
  auto checkpoints = std::vector<fs::path>();
  for (const auto& e : fs::directory_iterator(out))
    if (e.path().filename().string().rfind("checkpoint-", 0) == 0) checkpoints.push_back(e.path());
  ASSERT_EQ(checkpoints.size(), 1u) << run.output();
  const int stopped_at = std::stoi(checkpoints[0].filename().string().substr(11));
  auto resumed = sd::test::run_process(
      sd::test::under_launch(2, train(out, 1, stopped_at + 2, {"--resume_from_checkpoint=latest"})), 120s);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from"), std::string::npos) << resumed.output;
  EXPECT_TRUE(fs::exists(out / "learned_embeds.safetensors"));
}

}  // namespace
}  // namespace sd
