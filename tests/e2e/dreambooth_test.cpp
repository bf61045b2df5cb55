// End-to-end: `sdtrain dreambooth` on tiny-sd1. Without prior preservation it trains exactly as `sdtrain train` on a
// kohya folder of the same images captioned with the instance prompt; with it, the missing class images are first
// generated as `sdtrain generate` draws them (named and encoded as the script saves them, shared by the ranks) and
// kept for the next run; --train_text_encoder trains the whole text encoder beside the UNet; LoRA training writes
// adapters; bad command lines are one error line.
#include <c10/util/hash.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "io/atomic_file.h"
#include "io/image.h"
#include "io/jpeg.h"
#include "io/safetensors.h"
#include "process_util.h"
#include "test_util.h"

namespace sd {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

fs::path tiny_sd1() { return sd::test::fixtures() / "tiny-sd1"; }

std::string run_ok(const std::vector<std::string>& command) {
  const auto r = sd::test::run_process(command, 300s);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

io::TensorMap unet_of(const fs::path& out) {
  return io::load_safetensors(out / "unet" / "diffusion_pytorch_model.safetensors");
}

std::vector<std::string> short_run(const fs::path& out) {
  return {"--resolution=32",      "--center_crop", "--train_batch_size=2",        "--max_train_steps=2",
          "--learning_rate=1e-3", "--seed=4",      "--output_dir=" + out.string()};
}

void write_instances(const fs::path& dir) {
  for (int i = 0; i < 2; ++i) sd::test::write_pattern_png(dir / fmt::format("p{}.png", i), 40, 36, 3 + i);
}

std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

TEST(DreamBoothE2E, WithoutPriorPreservationTrainsAsTrainOnAKohyaFolderOfTheInstancePrompt) {
  sd::test::TempDir dir;
  write_instances(dir.path() / "sks");
  write_instances(dir.path() / "kohya" / "1_a photo of sks dog");
  std::vector<std::string> dreambooth = short_run(dir.path() / "dreambooth");
  dreambooth.push_back("--instance_data_dir=" + (dir.path() / "sks").string());
  dreambooth.push_back("--instance_prompt=a photo of sks dog");
  run_ok(sd::test::tiny_training_command("dreambooth", dreambooth));
  std::vector<std::string> train = short_run(dir.path() / "train");
  train.push_back("--train_data_dir=" + (dir.path() / "kohya").string());
  run_ok(sd::test::tiny_training_command("train", train));
  const io::TensorMap a = unet_of(dir.path() / "dreambooth"), b = unet_of(dir.path() / "train");
  for (const auto& [name, t] : a) EXPECT_TRUE(at::equal(t, b.at(name))) << name;
  EXPECT_FALSE(at::equal(
      a.at("conv_in.weight"),
      io::load_safetensors(tiny_sd1() / "unet" / "diffusion_pytorch_model.safetensors").at("conv_in.weight")));
}

// The class image the pipeline draws from `seed`, as `sdtrain generate` writes it.
io::RgbImage generated(const fs::path& dir, int64_t seed, const std::string& mixed_precision = "no") {
  run_ok({sd::test::sdtrain_binary(), "generate", "--model=" + tiny_sd1().string(), "--prompt=a photo of dog",
          fmt::format("--seed={}", seed), "--threads=1", "--mixed_precision=" + mixed_precision,
          "--output_dir=" + dir.string()});
  return io::load_image_rgb(dir / fmt::format("p0-s{}-i0.png", seed));
}

// The class images come from a pipeline of their own in --prior_generation_precision, else in --mixed_precision's:
// the bf16 image `sdtrain generate --mixed_precision bf16` draws, whatever precision training runs in.
TEST(DreamBoothE2E, ClassImagesAreGeneratedInThePriorGenerationPrecision) {
  sd::test::TempDir dir;
  write_instances(dir.path() / "sks");
  const std::string bf16_image = io::encode_jpeg(generated(dir.path() / "generate", 7, "bf16"), 75);
  for (const std::vector<std::string>& precision :
       {std::vector<std::string>{"--prior_generation_precision=bf16"},
        std::vector<std::string>{"--prior_generation_precision=fp16", "--mixed_precision=no"},
        std::vector<std::string>{"--mixed_precision=bf16"}}) {
    SCOPED_TRACE(precision.front());
    sd::test::TempDir run;
    std::vector<std::string> args = short_run(run.path() / "out");
    for (const std::string& flag :
         {"--instance_data_dir=" + (dir.path() / "sks").string(), std::string("--instance_prompt=a photo of sks dog"),
          std::string("--with_prior_preservation"), "--class_data_dir=" + (run.path() / "dog").string(),
          std::string("--class_prompt=a photo of dog"), std::string("--num_class_images=1"),
          std::string("--max_train_steps=1"), std::string("--seed=7")})
      args.push_back(flag);
    args.insert(args.end(), precision.begin(), precision.end());
    run_ok(sd::test::tiny_training_command("dreambooth", args));
    const std::set<std::string> images = names_in(run.path() / "dog");
    ASSERT_EQ(images.size(), 1U);
    EXPECT_TRUE(io::read_text_file(run.path() / "dog" / *images.begin()) == bf16_image);
  }
}

TEST(DreamBoothE2E, MissingClassImagesAreGeneratedAsGenerateDrawsThemSavedAsTheScriptNamesThemAndKept) {
  sd::test::TempDir dir;
  write_instances(dir.path() / "sks");
  const fs::path dog = dir.path() / "dog";
  auto prior_run = [&](int64_t class_images, const std::string& out, int ranks = 1, const std::string& extra = "") {
    std::vector<std::string> args = short_run(dir.path() / out);
    if (!extra.empty()) args.push_back(extra);
    for (const std::string& flag :
         {"--instance_data_dir=" + (dir.path() / "sks").string(), std::string("--instance_prompt=a photo of sks dog"),
          std::string("--with_prior_preservation"), "--class_data_dir=" + dog.string(),
          std::string("--class_prompt=a photo of dog"), fmt::format("--num_class_images={}", class_images),
          std::string("--sample_batch_size=1"), std::string("--max_train_steps=1"), std::string("--seed=7")})
      args.push_back(flag);
    const std::vector<std::string> command = sd::test::tiny_training_command("dreambooth", args);
    return run_ok(ranks == 1 ? command : sd::test::under_launch(ranks, command));
  };
  // Two ranks share the generation (one image each here) and both train on the two images.
  EXPECT_NE(prior_run(2, "first", 2).find("holds 0 of --num_class_images 2: generating 2"), std::string::npos);
  // Image i of the folder is drawn from seed + i and named "<i>-<SHA-1 of its pixels>.jpg", a quality-75 JPEG.
  std::set<std::string> expected;
  std::map<std::string, std::string> bytes;
  for (int64_t i = 0; i < 3; ++i) {
    const io::RgbImage image = generated(dir.path() / "generate", 7 + i);
    const std::string name =
        fmt::format("{}-{}.jpg", i, c10::sha1(std::string(image.pixels.begin(), image.pixels.end())).str());
    bytes[name] = io::encode_jpeg(image, 75);
    if (i < 2) expected.insert(name);
  }
  ASSERT_EQ(names_in(dog), expected);
  for (const std::string& name : expected) EXPECT_TRUE(io::read_text_file(dog / name) == bytes[name]) << name;
  // A run asking for one more generates only that one; one asking for fewer generates none.
  const std::string output = prior_run(3, "second");
  EXPECT_NE(output.find("holds 2 of --num_class_images 3: generating 1"), std::string::npos) << output;
  for (const auto& [name, b] : bytes) EXPECT_TRUE(io::read_text_file(dog / name) == b) << name;
  EXPECT_EQ(names_in(dog).size(), 3U);
  EXPECT_EQ(prior_run(1, "third").find("generating"), std::string::npos);
  // The class prompt's rows are pre-computed too: the same training as encoding each batch.
  const std::string fourth = prior_run(1, "fourth", 1, "--pre_compute_text_embeddings");
  EXPECT_NE(fourth.find("2 instance image(s) in " + (dir.path() / "sks").string() + ", 1 class image(s) in " +
                        dog.string() + ": 2 pairs per epoch"),
            std::string::npos);
  EXPECT_NE(fourth.find("2 prompt(s) encoded; the text encoder is released"), std::string::npos) << fourth;
  const io::TensorMap third = unet_of(dir.path() / "third");
  for (const auto& [name, t] : unet_of(dir.path() / "fourth"))
    EXPECT_TRUE(sd::test::close_rel_max(t, third.at(name), 1e-6)) << name;
  // Throughput counts images: 2 pairs a step are 4 images.
  const nlohmann::json step =
      nlohmann::json::parse(io::read_text_file(dir.path() / "fourth" / "logs" / "metrics.jsonl"));
  EXPECT_NEAR(step.at("images_per_s").get<double>() * step.at("step_time_s").get<double>(), 4.0, 1e-6) << step;
}

// As the script: the prompts are encoded once and the text encoder released; training and validation (from
// pre-computed prompt and negative-prompt rows) are what encoding each batch gives, bit for bit in float32.
TEST(DreamBoothE2E, PreComputedTextEmbeddingsTrainAndValidateAsEncodingEachBatch) {
  sd::test::TempDir dir;
  write_instances(dir.path() / "sks");
  auto run = [&](const std::string& out, const std::string& extra) {
    std::vector<std::string> args = short_run(dir.path() / out);
    for (const std::string& flag :
         {"--instance_data_dir=" + (dir.path() / "sks").string(), std::string("--instance_prompt=a photo of sks dog"),
          std::string("--validation_prompt=a sks dog"), std::string("--validation_steps=2"),
          std::string("--num_validation_images=1"), extra})
      if (!flag.empty()) args.push_back(flag);
    return run_ok(sd::test::tiny_training_command("dreambooth", args));
  };
  EXPECT_EQ(run("each", "").find("released"), std::string::npos);
  const std::string output = run("once", "--pre_compute_text_embeddings");
  EXPECT_NE(output.find("--pre_compute_text_embeddings: 2 prompt(s) encoded; the text encoder is released"),
            std::string::npos)
      << output;
  const io::TensorMap each = unet_of(dir.path() / "each");
  for (const auto& [name, t] : unet_of(dir.path() / "once")) EXPECT_TRUE(at::equal(t, each.at(name))) << name;
  const std::string image = io::read_text_file(dir.path() / "once" / "validation" / "step-2-0.png");
  EXPECT_TRUE(image == io::read_text_file(dir.path() / "each" / "validation" / "step-2-0.png"));
  EXPECT_TRUE(io::read_text_file(dir.path() / "once" / "text_encoder" / "model.safetensors") ==
              io::read_text_file(tiny_sd1() / "text_encoder" / "model.safetensors"));
}

io::TensorMap text_encoder_of(const fs::path& out) {
  return io::load_safetensors(out / "text_encoder" / "model.safetensors");
}

// The whole text encoder trains with the UNet: both are saved (as the script's pipeline and checkpoints hold them)
// and the pipeline generates; the UNet's first step is the one a frozen text encoder gives (nothing clips here); a
// resumed run writes the bits of an uninterrupted one; with both models' layers recomputed in backward
// (--gradient_checkpointing) the text encoder trains alike; two sharded ranks train what one rank with accumulation
// trains.
TEST(DreamBoothE2E, TrainTextEncoderTrainsBothModelsResumesExactlyAndShardsAsOneRank) {
  sd::test::TempDir dir;
  write_instances(dir.path() / "sks");
  auto run = [&](const std::string& out, std::vector<std::string> extra, int ranks = 1) {
    std::vector<std::string> args = {"--resolution=32",
                                     "--center_crop",
                                     "--train_batch_size=1",
                                     "--learning_rate=1e-3",
                                     "--max_grad_norm=1e9",
                                     "--use_ema",
                                     "--checkpointing_steps=1",
                                     "--resume_from_checkpoint=latest",
                                     "--seed=4",
                                     "--output_dir=" + (dir.path() / out).string(),
                                     "--instance_data_dir=" + (dir.path() / "sks").string(),
                                     "--instance_prompt=a photo of sks dog"};
    args.insert(args.end(), extra.begin(), extra.end());
    const std::vector<std::string> command = sd::test::tiny_training_command("dreambooth", args);
    return run_ok(ranks == 1 ? command : sd::test::under_launch(ranks, command));
  };
  const std::vector<std::string> accumulate = {"--train_text_encoder", "--gradient_accumulation_steps=2",
                                               "--max_train_steps=2"};
  run("whole", accumulate);
  const fs::path whole = dir.path() / "whole";
  const io::TensorMap start = io::load_safetensors(tiny_sd1() / "text_encoder" / "model.safetensors");
  for (const char* file : {"text_encoder/model.safetensors", "checkpoint-1/text_encoder/model.safetensors",
                           "checkpoint-1/text_encoder_ema/model.safetensors"}) {
    const fs::path trained = whole / file;
    const io::TensorMap weights = io::load_safetensors(trained);
    ASSERT_EQ(weights.size(), start.size()) << trained;
    for (const auto& [name, t] : start) {
      ASSERT_TRUE(weights.count(name)) << trained << " " << name;
      EXPECT_EQ(weights.at(name).scalar_type(), at::kFloat) << name;
    }
    EXPECT_FALSE(at::equal(weights.at("text_model.encoder.layers.0.mlp.fc1.weight"),
                           start.at("text_model.encoder.layers.0.mlp.fc1.weight")))
        << trained;
  }
  for (const char* config : {"text_encoder/config.json", "checkpoint-1/text_encoder/config.json"})
    EXPECT_EQ(nlohmann::json::parse(io::read_text_file(whole / config)).at("torch_dtype"), "float32");
  EXPECT_EQ(unet_of(whole / "checkpoint-1").count("text_model.embeddings.token_embedding.weight"), 0U);
  run_ok({sd::test::sdtrain_binary(), "generate", "--model=" + whole.string(), "--prompt=a photo of sks dog",
          "--num_inference_steps=2", "--threads=1", "--output_dir=" + (dir.path() / "generated").string()});

  run("frozen", {"--gradient_accumulation_steps=2", "--max_train_steps=1"});
  const io::TensorMap frozen = unet_of(dir.path() / "frozen" / "checkpoint-1"), both = unet_of(whole / "checkpoint-1");
  for (const auto& [name, t] : frozen) EXPECT_TRUE(at::equal(both.at(name), t)) << name;

  fs::create_directories(dir.path() / "resumed");
  fs::copy(whole / "checkpoint-1", dir.path() / "resumed" / "checkpoint-1", fs::copy_options::recursive);
  EXPECT_NE(run("resumed", accumulate).find("resuming from"), std::string::npos);
  for (const char* file : {"text_encoder/model.safetensors", "unet/diffusion_pytorch_model.safetensors",
                           "checkpoint-2/text_encoder_ema/model.safetensors", "checkpoint-2/optimizer.safetensors"})
    EXPECT_TRUE(io::read_text_file(whole / file) == io::read_text_file(dir.path() / "resumed" / file)) << file;

  // The UNet's recomputation changes the last bits of its gradients, and so of the text encoder's, which AdamW's
  // normalised steps carry into the updates of near-zero gradients: compared as updates, to 2%.
  std::vector<std::string> checkpointed = accumulate;
  checkpointed.push_back("--gradient_checkpointing");
  run("checkpointed", checkpointed);
  // The trained weights (the exported ones are the EMA's, which barely move in two steps).
  const io::TensorMap recomputed = text_encoder_of(dir.path() / "checkpointed" / "checkpoint-2");
  for (const auto& [name, t] : text_encoder_of(whole / "checkpoint-2")) {
    // Its exact gradient is zero (softmax ignores a shift shared by a row's scores): AdamW steps on rounding noise.
    if (name.find("k_proj.bias") != std::string::npos) continue;
    EXPECT_TRUE(sd::test::close_rel_max(recomputed.at(name) - start.at(name), t - start.at(name), 2e-2)) << name;
  }

  run("ranks", {"--train_text_encoder", "--sharding=shard_grad_op", "--max_train_steps=2"}, 2);
  const fs::path ranks = dir.path() / "ranks";
  for (const auto& [one, two] :
       {std::pair{text_encoder_of(whole), text_encoder_of(ranks)}, std::pair{unet_of(whole), unet_of(ranks)},
        std::pair{text_encoder_of(whole / "checkpoint-2"), text_encoder_of(ranks / "checkpoint-2")}}) {
    ASSERT_EQ(two.size(), one.size());
    for (const auto& [name, t] : one) EXPECT_TRUE(sd::test::close_rel_max(two.at(name), t, 2e-5)) << name;
  }
}

// With prior preservation and --lora_format kohya, the kohya file's metadata counts the instance images as training
// images and the class images as regularization images, as kohya counts its --reg_data_dir.
TEST(DreamBoothE2E, RankTrainsLoraAdaptersWithTheLoraScriptsDefaults) {
  sd::test::TempDir dir;
  write_instances(dir.path() / "sks");
  for (int i = 0; i < 3; ++i)
    sd::test::write_pattern_png(dir.path() / "dog" / fmt::format("c{}.png", i), 36, 40, 5 + i);
  std::vector<std::string> args = short_run(dir.path() / "lora");
  for (const char* flag : {"--rank=2", "--train_text_encoder", "--lora_format=kohya", "--with_prior_preservation",
                           "--class_prompt=a photo of dog", "--num_class_images=3"})
    args.push_back(flag);
  args.push_back("--class_data_dir=" + (dir.path() / "dog").string());
  args.push_back("--instance_data_dir=" + (dir.path() / "sks").string());
  args.push_back("--instance_prompt=a photo of sks dog");
  run_ok(sd::test::tiny_training_command("dreambooth", args));
  const io::SafeTensorsFile kohya(dir.path() / "lora" / "lora.safetensors");
  EXPECT_EQ(kohya.metadata().at("ss_num_train_images"), "2");
  EXPECT_EQ(kohya.metadata().at("ss_num_reg_images"), "3");
  const io::TensorMap lora = io::load_safetensors(dir.path() / "lora" / "pytorch_lora_weights.safetensors");
  int unet = 0, text_encoder = 0;
  for (const auto& [name, t] : lora) {
    unet += name.rfind("unet.", 0) == 0;
    text_encoder += name.rfind("text_encoder.", 0) == 0;
  }
  EXPECT_GT(unet, 0);
  EXPECT_GT(text_encoder, 0);
  const std::string run = io::read_text_file(dir.path() / "lora" / "logs" / "run.json");
  EXPECT_NE(run.find("\"validation_epochs\": \"50\""), std::string::npos) << run;
}

TEST(DreamBoothE2E, BadCommandLinesAreOneErrorLine) {
  sd::test::TempDir dir;
  write_instances(dir.path() / "sks");
  const std::vector<std::string> base = {"--instance_data_dir=" + (dir.path() / "sks").string(),
                                         "--instance_prompt=a photo of sks dog"};
  auto error_of = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    const auto r = sd::test::run_process(sd::test::tiny_training_command("dreambooth", args), 120s);
    EXPECT_NE(r.exit_code, 0);
    return r.output;
  };
  EXPECT_EQ(error_of({"--train_text_encoder", "--pre_compute_text_embeddings"}),
            "sdtrain: error: --train_text_encoder: cannot be used with --pre_compute_text_embeddings (see --help)\n");
  EXPECT_EQ(error_of({"--with_prior_preservation", "--class_prompt=dog"}),
            "sdtrain: error: --with_prior_preservation: needs --class_data_dir and --class_prompt (see --help)\n");
  EXPECT_EQ(error_of({"--validation_scheduler=Nope"}).rfind("sdtrain: error: --validation_scheduler: Nope not in", 0),
            0U);
  EXPECT_EQ(error_of({"--prior_generation_precision=fp64"})
                .rfind("sdtrain: error: --prior_generation_precision: fp64 not in {no,fp32,fp16,bf16}", 0),
            0U);
  const std::string missing = (dir.path() / "none").string();
  // Found before any class image is generated into the folder.
  const fs::path sks = dir.path() / "sks";
  EXPECT_EQ(error_of({"--with_prior_preservation", "--class_prompt=dog", "--class_data_dir=" + sks.string()}),
            "sdtrain: error: --class_data_dir " + sks.string() +
                " is --instance_data_dir: class images would train as the subject; keep them apart\n");
  EXPECT_EQ(names_in(sks).size(), 2U);
  EXPECT_EQ(error_of({"--instance_data_dir=" + missing, "--with_prior_preservation", "--class_prompt=dog",
                      "--class_data_dir=" + (dir.path() / "dog").string()}),
            "sdtrain: error: --instance_data_dir " + missing + ": not a directory\n");
  EXPECT_FALSE(fs::exists(dir.path() / "dog"));
  EXPECT_EQ(error_of({"--instance_data_dir=" + missing}),
            "sdtrain: error: --instance_data_dir " + missing + ": not a directory\n");
}

}  // namespace
}  // namespace sd
