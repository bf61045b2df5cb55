// Sharded UNet training across processes: a checkpoint written by 2 sharded ranks resumes on 1 rank and on 3 ranks
// (the state is resharded) and ends where an uninterrupted run ends; a killed sharded rank is named by the others
// and the last whole checkpoint resumes.
#include <csignal>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "dist/store_listen.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "process_util.h"
#include "test_util.h"

namespace sd {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class UNetTrainingDist : public ::testing::Test {
 protected:
  void SetUp() override { sd::test::write_captioned_images(data(), 12); }
  fs::path data() const { return dir_.path() / "data"; }

  // A global batch of 6, whatever the number of ranks: 2 ranks x 3 micro-batches, 3 x 2 or 1 x 6.
  std::vector<std::string> train(const fs::path& out, int steps, const std::string& sharding,
                                 const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> args = {sd::test::sdtrain_binary(),
                                     "train",
                                     "--pretrained_model_name_or_path=" + (sd::test::fixtures() / "tiny-sd1").string(),
                                     "--train_data_dir=" + data().string(),
                                     "--resolution=32",
                                     "--train_batch_size=1",
                                     "--global_batch_size=6",
                                     "--max_train_steps=" + std::to_string(steps),
                                     "--checkpointing_steps=2",
                                     "--learning_rate=1e-3",
                                     "--lr_warmup_steps=0",
                                     "--use_ema",
                                     "--random_flip",
                                     "--seed=5",
                                     "--sharding=" + sharding,
                                     "--threads=1",
                                     "--dist_timeout=30",
                                     "--output_dir=" + out.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  static io::TensorMap unet(const fs::path& out) {
    return io::load_safetensors(out / "unet" / "diffusion_pytorch_model.safetensors");
  }

  sd::test::TempDir dir_;
};

// Ranks sum gradients in another order than a single rank does: float32 reduction noise (observed: 3e-6 of max|w|).
// A lost micro-batch or a wrongly resharded moment moves weights by ~lr = 1e-3 of weights ~0.05-1, far above this.
// Parameters whose exact gradient is zero are pure noise in every run and are left out (test_util.h).
constexpr double kReductionTolerance = 1e-4;

TEST_F(UNetTrainingDist, ShardedCheckpointResumesOnOneAndOnThreeRanks) {
  const fs::path whole = dir_.path() / "whole", split = dir_.path() / "split";
  auto a = sd::test::run_process(sd::test::under_launch(2, train(whole, 4, "shard_grad_op")), 300s);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  auto b = sd::test::run_process(sd::test::under_launch(2, train(split, 2, "shard_grad_op")), 300s);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  // Every rank wrote its own slice of the state; the manifest lists the pieces.
  for (const char* shard : {"shards/rank-00000-of-00002.safetensors", "shards/rank-00001-of-00002.safetensors",
                            "manifest.json", "unet/config.json", "unet_ema/config.json"})
    EXPECT_TRUE(fs::exists(split / "checkpoint-2" / shard)) << shard;
  // Beside the shards, the weights and their EMA whole, as diffusers loads them: the pieces put together.
  const fs::path checkpoint = split / "checkpoint-2";
  const nlohmann::json manifest = nlohmann::json::parse(io::read_text_file(checkpoint / "manifest.json"));
  std::map<std::string, io::TensorMap> shards;
  for (const auto& [kind, file] : {std::pair{"master", "unet"}, std::pair{"ema", "unet_ema"}}) {
    const io::TensorMap whole_weights = io::load_safetensors(checkpoint / file / "diffusion_pytorch_model.safetensors");
    ASSERT_EQ(whole_weights.size(), unet(whole).size()) << file;
    int64_t compared = 0;
    for (const auto& piece : manifest["trained"]["pieces"]) {
      if (piece["kind"] != kind) continue;
      const std::string shard = piece["file"];
      if (!shards.count(shard)) shards[shard] = io::load_safetensors(checkpoint / shard);
      const at::Tensor expected = whole_weights.at(piece["param"]).flatten().slice(0, piece["begin"], piece["end"]);
      EXPECT_TRUE(at::equal(shards[shard].at(piece["key"]), expected)) << file << " " << piece.dump();
      compared += piece["end"].get<int64_t>() - piece["begin"].get<int64_t>();
    }
    int64_t elements = 0;
    for (const auto& [name, t] : whole_weights) elements += t.numel();
    EXPECT_EQ(compared, elements) << file;
  }

  struct Resume {
    int ranks;
    const char* sharding;
  };
  for (const Resume& r : {Resume{1, "no_shard"}, Resume{3, "shard_grad_op"}}) {
    const fs::path out = dir_.path() / ("resumed-on-" + std::to_string(r.ranks));
    fs::copy(split, out, fs::copy_options::recursive);
    auto command = train(out, 4, r.sharding, {"--resume_from_checkpoint=latest"});
    auto c = sd::test::run_process(r.ranks == 1 ? command : sd::test::under_launch(r.ranks, command), 300s);
    ASSERT_EQ(c.exit_code, 0) << c.output;
    EXPECT_NE(c.output.find("resuming from"), std::string::npos) << c.output;
    const io::TensorMap expected = unet(whole), resumed = unet(out);
    static const std::set<std::string> noise =
        sd::test::zero_gradient_parameters(sd::test::fixtures() / "tiny-sd1" / "unet");
    for (const auto& [name, t] : expected) {
      if (!noise.count(name)) {
        EXPECT_TRUE(sd::test::close_rel_max(resumed.at(name), t, kReductionTolerance)) << r.ranks << " ranks: " << name;
      }
    }
  }
}

// Rank r of a 2-rank world on `port`, started as torchrun starts it.
std::unique_ptr<sd::test::Process> start_rank(int r, int port, const std::vector<std::string>& command) {
  return std::make_unique<sd::test::Process>(command,
                                             std::map<std::string, std::string>{{"RANK", std::to_string(r)},
                                                                                {"WORLD_SIZE", "2"},
                                                                                {"LOCAL_RANK", std::to_string(r)},
                                                                                {"LOCAL_WORLD_SIZE", "2"},
                                                                                {"MASTER_ADDR", "127.0.0.1"},
                                                                                {"MASTER_PORT", std::to_string(port)}});
}

TEST_F(UNetTrainingDist, KilledShardedRankIsNamedAndTheLastCheckpointResumes) {
  const fs::path out = dir_.path() / "killed";
  const int port = dist::find_free_port();
  std::vector<std::unique_ptr<sd::test::Process>> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.push_back(start_rank(r, port, train(out, 100000, "shard_grad_op", {"--dist_timeout=20"})));
  // Once a checkpoint is whole, kill rank 1 outright, mid-training.
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (!fs::exists(out / "checkpoint-2" / "manifest.json") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(fs::exists(out / "checkpoint-2" / "manifest.json")) << ranks[0]->output();
  ranks[1]->signal(SIGKILL);
  ASSERT_TRUE(ranks[0]->wait(60s)) << "rank 0 must not hang";
  EXPECT_NE(ranks[0]->exit_code(), 0);
  EXPECT_NE(ranks[0]->output().find("rank 1"), std::string::npos) << ranks[0]->output();

  auto resumed = sd::test::run_process(
      sd::test::under_launch(2, train(out, 6, "shard_grad_op", {"--resume_from_checkpoint=latest"})), 300s);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from"), std::string::npos) << resumed.output;
  EXPECT_TRUE(fs::exists(out / "unet" / "diffusion_pytorch_model.safetensors"));
}

// Ranks started with different settings stop at start-up, every rank naming the setting and both values, before any
// training collective could abort in Gloo.
TEST_F(UNetTrainingDist, RanksThatDisagreeOnTheRunStopWithOneLine) {
  const fs::path out = dir_.path() / "disagree";
  const int port = dist::find_free_port();
  auto rank0 = start_rank(0, port, train(out, 2, "no_shard"));
  auto rank1 = start_rank(1, port, train(out, 2, "no_shard", {"--adam_weight_decay=0.02"}));
  ASSERT_TRUE(sd::test::wait_all({rank0.get(), rank1.get()}, 120s)) << "ranks must not hang";
  for (auto* rank : {rank0.get(), rank1.get()}) {
    EXPECT_NE(rank->exit_code(), 0) << rank->output();
    EXPECT_NE(rank->output().find("ranks disagree on the run: --adam_weight_decay is \"0.01\" on rank 0 but "
                                  "\"0.02\" on rank 1"),
              std::string::npos)
        << rank->output();
    EXPECT_EQ(rank->output().find("terminate called"), std::string::npos) << rank->output();
  }
  EXPECT_FALSE(fs::exists(out / "checkpoint-2"));
}

// `command` run from inside `folder`, so that a relative --output_dir lands there.
std::vector<std::string> run_in(const fs::path& folder, const std::vector<std::string>& command) {
  fs::create_directories(folder);
  std::vector<std::string> argv = {"sh", "-c", "cd \"$1\" && shift && exec \"$@\"", "sh", folder.string()};
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

// Each rank with an --output_dir of its own, as on machines whose "out" is a local disk: sharded training refuses
// to start (its checkpoints would lack the other ranks' pieces); unsharded training, whose checkpoints rank 0 writes
// whole, warns that a resume needs them on every machine. A flag given at its default agrees with one not given.
TEST_F(UNetTrainingDist, RanksThatDoNotShareTheOutputFolderAreNamed) {
  const fs::path machine0 = dir_.path() / "machine0", machine1 = dir_.path() / "machine1";
  {
    const int port = dist::find_free_port();
    auto rank0 = start_rank(0, port, run_in(machine0, train("out", 2, "shard_grad_op")));
    auto rank1 = start_rank(1, port, run_in(machine1, train("out", 2, "shard_grad_op")));
    ASSERT_TRUE(sd::test::wait_all({rank0.get(), rank1.get()}, 120s)) << "ranks must not hang";
    for (int r : {0, 1}) {
      const sd::test::Process& rank = r == 0 ? *rank0 : *rank1;
      EXPECT_NE(rank.exit_code(), 0) << rank.output();
      EXPECT_NE(rank.output().find(sd::test::rank_error(r) +
                                   "--output_dir out: rank(s) 1 do not see the files rank 0 writes there; sharded "
                                   "checkpoints are written by every rank into one folder"),
                std::string::npos)
          << rank.output();
    }
    EXPECT_FALSE(fs::exists(machine0 / "out" / "checkpoint-2"));
    EXPECT_EQ(std::distance(fs::directory_iterator(machine0 / "out"), fs::directory_iterator()), 0);
  }
  const int port = dist::find_free_port();
  auto rank0 = start_rank(0, port,
                          run_in(machine0, train("out", 2, "no_shard",
                                                 {"--adam_beta2=0.999", "--max_grad_norm=1", "--adam_epsilon=1e-8"})));
  auto rank1 = start_rank(1, port, run_in(machine1, train("out", 2, "no_shard")));
  ASSERT_TRUE(sd::test::wait_all({rank0.get(), rank1.get()}, 180s)) << "ranks must not hang";
  EXPECT_EQ(rank0->exit_code(), 0) << rank0->output();
  EXPECT_EQ(rank1->exit_code(), 0) << rank1->output();
  EXPECT_NE(rank0->output().find("--output_dir out: rank(s) 1 do not see the files rank 0 writes there: checkpoints "
                                 "are written by rank 0 alone, but to resume, every machine must see them"),
            std::string::npos)
      << rank0->output();
  EXPECT_TRUE(fs::exists(machine0 / "out" / "checkpoint-2" / "manifest.json"));
}

}  // namespace
}  // namespace sd
