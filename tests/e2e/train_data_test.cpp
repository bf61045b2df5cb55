// End-to-end: data at pretraining scale on tiny-sd1. Training straight from WebDataset shards (2 ranks = 1 rank
// with accumulation, resume from a mid-epoch checkpoint bit for bit), `sdtrain preprocess` on 2 ranks killed and
// rerun (every input encoded exactly once) and training from its latents equal to training on the images, bucketed
// training on mixed aspect ratios (2 ranks = 1 rank), regularization images (kohya's --reg_data_dir), and the errors
// for bad data.
#include <csignal>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "io/tar_builder.h"
#include "process_util.h"
#include "test_util.h"

namespace sd {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using nlohmann::json;

void run_ok(const std::vector<std::string>& command) {
  const auto r = sd::test::run_process(command, 300s);
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

io::TensorMap unet_of(const fs::path& out) {
  return io::load_safetensors(out / "unet" / "diffusion_pytorch_model.safetensors");
}

// Ranks sum gradients in another order than one rank does: float32 noise (as in train_test's comparison).
void expect_same_weights(const fs::path& a, const fs::path& b, double tolerance = 2e-5) {
  const io::TensorMap x = unet_of(a), y = unet_of(b);
  for (const auto& [name, t] : x) EXPECT_TRUE(sd::test::close_rel_max(y.at(name), t, tolerance)) << name;
}

std::vector<double> losses(const fs::path& out) {
  std::vector<double> values;
  std::ifstream log(out / "logs" / "metrics.jsonl");
  for (std::string line; std::getline(log, line);) values.push_back(json::parse(line)["loss"].get<double>());
  return values;
}

// Two WebDataset shards made from the fixture images and drawn patterns: 12 samples with captions in .txt or .json,
// one of which has an image that does not decode (replaced by the next sample when loaded), and a sample without a
// caption (dropped when indexing).
std::string write_shards(const fs::path& dir) {
  fs::create_directories(dir);
  const fs::path images = sd::test::fixtures() / "golden" / "images";
  std::vector<std::pair<std::string, std::string>> members;  // name, bytes
  for (const char* fixture : {"landscape_160x120.jpg", "toy_alpha_100x100.png", "portrait_90x140.png"}) {
    const std::string key = fs::path(fixture).stem().string();
    members.emplace_back(key + fs::path(fixture).extension().string(), io::read_text_file(images / fixture));
    members.emplace_back(key + ".txt", "a photo of " + key);
  }
  for (int i = 0; i < 8; ++i) {
    const fs::path png = dir / "tmp.png";
    sd::test::write_pattern_png(png, 40 + 4 * (i % 3), 36 + 8 * (i % 2), 3 + i);
    members.emplace_back(fmt::format("p{:02d}.png", i), io::read_text_file(png));
    members.emplace_back(fmt::format("p{:02d}.json", i), json{{"caption", fmt::format("pattern {}", i)}}.dump());
  }
  fs::remove(dir / "tmp.png");
  members.emplace(members.begin() + 4, "uncaptioned.png", members[2].second);
  members.emplace(members.begin() + 9, "broken.jpg", "not a jpeg");
  members.emplace(members.begin() + 10, "broken.txt", "never seen");
  sd::test::TarBuilder first, second;
  for (size_t m = 0; m < members.size(); ++m)  // the first 13 members end with sample p01
    (m < 13 ? first : second).file(members[m].first, members[m].second);
  first.end().write(dir / "shard-00000.tar");
  second.end().write(dir / "shard-00001.tar");
  return (dir / "shard-{00000..00001}.tar").string();
}

std::vector<std::string> shard_flags(const std::string& shards, const fs::path& out, int accumulation) {
  return {"--train_shards=" + shards,
          "--resolution=32",
          "--random_flip",
          "--caption_dropout_probability=0.3",
          "--train_batch_size=1",
          "--gradient_accumulation_steps=" + std::to_string(accumulation),
          "--max_train_steps=4",
          "--checkpointing_steps=2",
          "--learning_rate=1e-3",
          "--lr_warmup_steps=0",
          "--use_ema",
          "--seed=7",
          "--dataloader_num_workers=2",
          "--output_dir=" + out.string()};
}

TEST(TrainDataE2E, ShardsTrainOnTwoRanksAsOnOneAndResumeMidEpochBitForBit) {
  sd::test::TempDir dir;
  const std::string shards = write_shards(dir.path() / "shards");
  const fs::path single = dir.path() / "single", multi = dir.path() / "multi", resumed = dir.path() / "resumed";
  const auto a = sd::test::run_process(sd::test::tiny_training_command("train", shard_flags(shards, single, 2)), 300s);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("12 training images (webdataset layout)"), std::string::npos) << a.output;
  EXPECT_NE(a.output.find("1 sample(s) without an image"), std::string::npos) << a.output;
  run_ok(sd::test::under_launch(2, sd::test::tiny_training_command("train", shard_flags(shards, multi, 1))));
  expect_same_weights(single, multi);

  // 12 samples make 6 steps of 2 per epoch: checkpoint-2 is mid-epoch. Resuming from it gives the same bits.
  fs::create_directories(resumed);
  fs::copy(single / "checkpoint-2", resumed / "checkpoint-2", fs::copy_options::recursive);
  auto flags = shard_flags(shards, resumed, 2);
  flags.push_back("--resume_from_checkpoint=latest");
  const auto c = sd::test::run_process(sd::test::tiny_training_command("train", flags), 300s);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(c.output.find("resuming from"), std::string::npos) << c.output;
  EXPECT_EQ(io::read_text_file(single / "unet" / "diffusion_pytorch_model.safetensors"),
            io::read_text_file(resumed / "unet" / "diffusion_pytorch_model.safetensors"));
}

// Waits until `dir` holds at least one finished latent shard.
bool wait_for_a_shard(const fs::path& dir, sd::test::Process& run) {
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (std::chrono::steady_clock::now() < deadline && run.running()) {
    if (fs::exists(dir / "latents-00000.safetensors") || fs::exists(dir / "latents-00001.safetensors")) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

// Rank `rank` of 2 on this machine, in torchrun's variables.
std::map<std::string, std::string> rank_env(int rank) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", "2"},
          {"LOCAL_RANK", std::to_string(rank)},
          {"LOCAL_WORLD_SIZE", "2"}};
}

std::map<std::string, fs::file_time_type> finished_shards(const fs::path& dir) {
  std::map<std::string, fs::file_time_type> shards;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors" && e.path().filename().string().rfind("latents-", 0) == 0)
      shards[e.path().filename().string()] = fs::last_write_time(e.path());
  return shards;
}

TEST(TrainDataE2E, PreprocessKilledAndRerunEncodesEachInputOnceAndTrainsAsOnlineTraining) {
  sd::test::TempDir dir;
  const fs::path images = dir.path() / "images", latents = dir.path() / "latents";
  sd::test::write_captioned_images(images, 40);
  const std::vector<std::string> preprocess = sd::test::tiny_training_command(
      "preprocess", {"--train_data_dir=" + images.string(), "--resolution", "32", "--samples_per_shard=2",
                     "--batch_size=1", "--output_dir=" + latents.string()});

  // The two ranks are started as torchrun starts them, each in its own process group, so that SIGKILL reaches the
  // ranks themselves (`sdtrain launch` would pass its own death on to them as SIGTERM).
  sd::test::Process rank0(preprocess, rank_env(0)), rank1(preprocess, rank_env(1));
  ASSERT_TRUE(wait_for_a_shard(latents, rank0)) << rank0.output();
  for (sd::test::Process* rank : {&rank0, &rank1}) {
    rank->signal_group(SIGKILL);
    ASSERT_TRUE(rank->wait(30s));
  }
  ASSERT_FALSE(fs::exists(latents / "index.json")) << "killed too late to test resuming:\n" << rank0.output();
  const auto kept = finished_shards(latents);
  run_ok(sd::test::under_launch(2, preprocess));

  // Every input once, in order: shard k holds samples 2k and 2k + 1 of the 40; shards finished before the kill were
  // kept as they were; no temporary file is left.
  const json index = json::parse(io::read_text_file(latents / "index.json"));
  EXPECT_EQ(index["samples"], 40);
  ASSERT_EQ(index["shards"].size(), 20u);
  std::multiset<std::string> sources;
  for (int k = 0; k < 20; ++k) {
    const io::SafeTensorsFile shard(latents / index["shards"][k]["file"].get<std::string>());
    for (const auto& source : json::parse(shard.metadata().at("sources"))) sources.insert(source.get<std::string>());
    for (int n : {2 * k, 2 * k + 1})
      for (const char* field : {"latent_mean.32", "latent_std.32", "text_hidden"})
        EXPECT_TRUE(shard.contains(fmt::format("{}.{}", n, field))) << k << ": " << n << "." << field;
    EXPECT_EQ(shard.names().size(), 6u);
  }
  EXPECT_EQ(sources.size(), 40u);
  EXPECT_EQ(std::set<std::string>(sources.begin(), sources.end()).size(), 40u);
  for (const auto& [name, written] : kept) EXPECT_EQ(fs::last_write_time(latents / name), written) << name;
  for (const auto& e : fs::directory_iterator(latents))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();

  // Training from the stored posteriors draws the latents online training draws from the same images.
  auto train = [&](const std::string& data, const fs::path& out) {
    run_ok(sd::test::tiny_training_command(
        "train", {data, "--resolution=32", "--center_crop", "--caption_dropout_probability=0.2", "--train_batch_size=1",
                  "--gradient_accumulation_steps=2", "--max_train_steps=3", "--learning_rate=1e-3",
                  "--lr_warmup_steps=0", "--seed=5", "--output_dir=" + out.string()}));
  };
  train("--train_data_dir=" + images.string(), dir.path() / "online");
  train("--train_latents=" + latents.string(), dir.path() / "offline");
  const std::vector<double> online = losses(dir.path() / "online"), offline = losses(dir.path() / "offline");
  ASSERT_EQ(online.size(), 3u);
  ASSERT_EQ(offline.size(), 3u);
  for (size_t k = 0; k < 3; ++k) EXPECT_NEAR(offline[k], online[k], 1e-5 * std::abs(online[k])) << k;
  expect_same_weights(dir.path() / "online", dir.path() / "offline", 1e-5);
}

TEST(TrainDataE2E, BucketedTrainingOnMixedAspectRatiosOnTwoRanksAsOnOne) {
  sd::test::TempDir dir;
  const fs::path images = dir.path() / "images";
  // Landscapes, portraits and squares; with --resolution 64 and steps of 16 they fall into 80x48, 48x80 and 64x64
  // (sides the tiny UNet's latents, a quarter of them, can halve twice).
  const std::vector<std::pair<int, int>> sizes = {{100, 60}, {60, 100}, {70, 70}, {105, 63}, {63, 105}, {80, 80},
                                                  {96, 58},  {58, 96},  {64, 64}, {90, 54},  {54, 90},  {72, 72}};
  for (size_t i = 0; i < sizes.size(); ++i) {
    sd::test::write_pattern_png(images / fmt::format("img{:02d}.png", i), sizes[i].first, sizes[i].second, 5 + i);
    std::ofstream(images / fmt::format("img{:02d}.txt", i)) << "pattern, stripes, number " << i << ", colour";
  }
  auto flags = [&](const fs::path& out, int accumulation) {
    return std::vector<std::string>{"--train_data_dir=" + images.string(),
                                    "--enable_bucket",
                                    "--resolution=64",
                                    "--min_bucket_reso=32",
                                    "--max_bucket_reso=128",
                                    "--bucket_reso_steps=16",
                                    "--random_flip",
                                    "--shuffle_caption",
                                    "--keep_tokens=1",
                                    "--train_batch_size=2",
                                    "--gradient_accumulation_steps=" + std::to_string(accumulation),
                                    "--max_train_steps=3",
                                    "--learning_rate=1e-3",
                                    "--lr_warmup_steps=0",
                                    "--seed=9",
                                    "--output_dir=" + out.string()};
  };
  // A micro-batch stacks its images into one tensor: a run that mixed sizes in a micro-batch would fail.
  const auto a = sd::test::run_process(sd::test::tiny_training_command("train", flags(dir.path() / "single", 2)), 300s);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("aspect-ratio buckets (width x height: samples): 48x80: 4, 64x64: 4, 80x48: 4"),
            std::string::npos)
      << a.output;
  run_ok(sd::test::under_launch(2, sd::test::tiny_training_command("train", flags(dir.path() / "multi", 1))));
  expect_same_weights(dir.path() / "single", dir.path() / "multi");
}

// kohya's regularization images (--reg_data_dir, DreamBooth's prior preservation) train as more samples after the
// training images: with --prior_loss_weight 1, a regularization folder holding the training images gives the run a
// training folder holding them twice gives, bit for bit; with another weight it trains otherwise.
TEST(TrainDataE2E, RegularizationImagesTrainAfterTheTrainingImagesWithTheirWeight) {
  sd::test::TempDir dir;
  const fs::path train = dir.path() / "train", reg = dir.path() / "reg", both = dir.path() / "both";
  for (int i = 0; i < 2; ++i) {
    for (const fs::path& folder : {train / "2_a", reg / "2_a", both / "2_a", both / "2_b"}) {
      sd::test::write_pattern_png(folder / fmt::format("p{}.png", i), 40, 36, 3 + i);
      std::ofstream(folder / fmt::format("p{}.txt", i)) << "pattern " << i;
    }
  }
  auto flags = [&](const fs::path& out, std::vector<std::string> data) {
    for (const char* flag : {"--resolution=32", "--center_crop", "--train_batch_size=2", "--max_train_steps=4",
                             "--learning_rate=1e-3", "--lr_warmup_steps=0", "--seed=4"})
      data.push_back(flag);
    data.push_back("--output_dir=" + out.string());
    return sd::test::tiny_training_command("train", data);
  };
  const auto r = sd::test::run_process(
      flags(dir.path() / "with_reg", {"--train_data_dir=" + train.string(), "--reg_data_dir=" + reg.string()}), 300s);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("2 image(s) make 4 regularization samples per epoch, loss weight 1"), std::string::npos)
      << r.output;
  run_ok(flags(dir.path() / "twice", {"--train_data_dir=" + both.string()}));
  run_ok(flags(dir.path() / "weighted",
               {"--train_data_dir=" + train.string(), "--reg_data_dir=" + reg.string(), "--prior_loss_weight=0.25"}));
  const io::TensorMap with_reg = unet_of(dir.path() / "with_reg"), twice = unet_of(dir.path() / "twice"),
                      weighted = unet_of(dir.path() / "weighted");
  for (const auto& [name, t] : with_reg) EXPECT_TRUE(at::equal(t, twice.at(name))) << name;
  EXPECT_FALSE(at::equal(with_reg.at("conv_in.weight"), weighted.at("conv_in.weight")));
}

// A rerun keeps finished shards only when they hold the same samples encoded by the same model: an interrupted
// preprocess rerun over other images of the same count, or with another model, would mix two datasets or two
// latent spaces into one directory.
TEST(TrainDataE2E, PreprocessKeepsNoShardOfOtherImagesOrAnotherModel) {
  sd::test::TempDir dir;
  const fs::path images = dir.path() / "images", others = dir.path() / "others", latents = dir.path() / "latents";
  sd::test::write_captioned_images(images, 4);
  sd::test::write_captioned_images(others, 4);
  for (const char* ext : {".png", ".txt"})
    fs::rename(others / (std::string("img0") + ext), others / (std::string("z") + ext));
  const fs::path model = dir.path() / "model";
  ASSERT_EQ(sd::test::run_command(sd::test::sdtrain_binary() + " init --preset tiny --seed 9 --out " + model.string())
                .exit_code,
            0);
  auto preprocess = [&](const fs::path& inputs, const std::string& model_flag) {
    std::vector<std::string> command =
        sd::test::tiny_training_command("preprocess", {"--train_data_dir=" + inputs.string(), "--resolution=32",
                                                       "--samples_per_shard=2", "--output_dir=" + latents.string()});
    if (!model_flag.empty()) command.push_back(model_flag);
    return sd::test::run_process(command, 300s);
  };
  ASSERT_EQ(preprocess(images, "").exit_code, 0);
  auto interrupt = [&] { fs::remove(latents / "index.json"), fs::remove(latents / "latents-00001.safetensors"); };
  interrupt();
  const auto r = preprocess(images, "");  // the same command: the finished shard is kept
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("1 shard(s) encoded, 1 kept from an earlier run"), std::string::npos) << r.output;
  for (const auto& [inputs, model_flag] :
       {std::pair{others, std::string()}, std::pair{images, "--pretrained_model_name_or_path=" + model.string()}}) {
    interrupt();
    const auto other = preprocess(inputs, model_flag);
    EXPECT_NE(other.exit_code, 0) << other.output;
    EXPECT_NE(other.output.find("latents-00000.safetensors: made with other settings"), std::string::npos)
        << other.output;
    EXPECT_FALSE(fs::exists(latents / "index.json"));
  }
}

TEST(TrainDataE2E, BadDataIsOneErrorLine) {
  sd::test::TempDir dir;
  const fs::path out = dir.path() / "out";
  auto expect_error = [&](const std::string& subcommand, const std::vector<std::string>& args,
                          const std::string& fragment) {
    std::string line;
    for (const auto& a : sd::test::tiny_training_command(subcommand, args)) line += "'" + a + "' ";
    EXPECT_TRUE(sd::test::is_one_line_error(sd::test::run_command(line), fragment)) << line;
  };
  const std::string out_flag = "--output_dir=" + out.string();
  expect_error("train", {"--train_shards=" + (dir.path() / "none-*.tar").string(), out_flag}, "matches no file");
  std::ofstream(dir.path() / "corrupt.tar") << std::string(3000, 'x');
  expect_error("train", {"--train_shards=" + (dir.path() / "corrupt.tar").string(), out_flag},
               "corrupt.tar: not a tar archive");
  sd::test::TarBuilder().file("a.png", "x").file("a.txt", "y").end().write(dir.path() / "shard-0.tar");
  expect_error("train", {"--train_shards=" + (dir.path() / "shard-{0..1}.tar").string(), out_flag},
               "shard-1.tar: shard not found");
  fs::create_directories(dir.path() / "no-index");
  expect_error("train", {"--train_latents=" + (dir.path() / "no-index").string(), out_flag}, "no index.json");
  expect_error("train", {"--train_shards=x.tar", "--train_data_dir=y", out_flag}, "give exactly one of");
  expect_error("train", {"--synthetic_data=latents", "--enable_bucket", out_flag}, "--enable_bucket need real data");
  expect_error("preprocess", {out_flag}, "give exactly one of --train_data_dir and --train_shards");
  expect_error("train", {"--synthetic_data=images", "--reg_data_dir=" + dir.path().string(), out_flag},
               "--reg_data_dir needs --train_data_dir");
  expect_error("train", {"--train_data_dir=" + dir.path().string(), "--prior_loss_weight=-1", out_flag},
               "--prior_loss_weight: -1 is not a number >= 0");

  // Latents of several sizes, as bucketed preprocessing writes them, train only with --enable_bucket.
  const fs::path images = dir.path() / "images", latents = dir.path() / "latents";
  sd::test::write_pattern_png(images / "wide.png", 128, 64, 3);
  sd::test::write_pattern_png(images / "square.png", 40, 40, 5);
  run_ok(sd::test::tiny_training_command(
      "preprocess",
      {"--train_data_dir=" + images.string(), "--resolution", "64", "--enable_bucket", "--min_bucket_reso=32",
       "--max_bucket_reso=128", "--bucket_reso_steps=16", "--output_dir=" + latents.string()}));
  expect_error("train", {"--train_latents=" + latents.string(), "--resolution=64", out_flag},
               "train with --enable_bucket on latents of several sizes");
  expect_error("train", {"--train_latents=" + latents.string(), "--resolution=32", out_flag},
               "holds latents at resolution(s) 64, not at --resolution 32");
  expect_error("train", {"--train_latents=" + latents.string(), "--resolution=64", "--random_flip", out_flag},
               "--random_flip needs pixels");
  EXPECT_FALSE(fs::exists(out / "unet"));
}

}  // namespace
}  // namespace sd
