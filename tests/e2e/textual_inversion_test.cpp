// End-to-end: `sdtrain textual-inversion` on the tiny preset and images the test draws.
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/hub_cache_util.h"
#include "io/image.h"
#include "io/safetensors.h"
#include "pipeline/embedding_file.h"
#include "pipeline/stable_diffusion.h"
#include "test_util.h"

namespace sd {
namespace {

namespace fs = std::filesystem;
using sd::test::run_command;

std::string sdtrain(const std::string& args) { return sd::test::sdtrain_binary() + " " + args; }

// A tiny pipeline and a folder of three drawn images, shared by the tests of this file.
class TextualInversionE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new sd::test::TempDir();
    auto r = run_command(sdtrain("init --preset tiny --seed 5 --out " + model().string()));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (int i = 0; i < 3; ++i)
      sd::test::write_pattern_png(images() / ("img" + std::to_string(i) + ".png"), 70 + 10 * i, 60, 7 + i);
  }
  static void TearDownTestSuite() { delete dir_; }
  static fs::path model() { return dir_->path() / "model"; }
  static fs::path images() { return dir_->path() / "images"; }

  // The seed deployment's flags, scaled to the tiny model.
  static std::string train_args(const fs::path& out, const std::string& extra = "") {
    return "textual-inversion --pretrained_model_name_or_path=" + model().string() +
           " --train_data_dir=" + images().string() +
           " --learnable_property=object --placeholder_token=\"<dicoo>\" --initializer_token=toy --resolution=32"
           " --train_batch_size=2 --seed=7 --gradient_accumulation_steps=1 --learning_rate=2.0e-03 --scale_lr"
           " --lr_scheduler=constant --lr_warmup_steps=0 --threads 1 --output_dir=" +
           out.string() + " " + extra;
  }

  sd::test::TempDir out_;
  static sd::test::TempDir* dir_;
};
sd::test::TempDir* TextualInversionE2E::dir_ = nullptr;

TEST_F(TextualInversionE2E, TrainsAndWritesEveryOutput) {
  auto r = run_command(sdtrain(train_args(out_.path(),
                                          "--max_train_steps=4 --save_steps=2 --checkpointing_steps=2 "
                                          "--checkpoints_total_limit=1 --save_as_full_pipeline "
                                          "--validation_prompt='a photo of <dicoo>' --validation_steps=4 "
                                          "--num_validation_images=2")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path out = out_.path();
  io::SafeTensorsFile embeds(out / "learned_embeds.safetensors");
  EXPECT_EQ(embeds.names(), std::vector<std::string>{"<dicoo>"});
  EXPECT_EQ(embeds.entry("<dicoo>").shape, (std::vector<int64_t>{1, 32}));
  EXPECT_EQ(embeds.metadata().at("format"), "pt");
  EXPECT_TRUE(fs::exists(out / "learned_embeds-steps-2.safetensors"));
  EXPECT_TRUE(fs::exists(out / "learned_embeds-steps-4.safetensors"));
  EXPECT_FALSE(fs::exists(out / "checkpoint-2")) << "--checkpoints_total_limit=1 keeps only the newest";
  EXPECT_TRUE(fs::exists(out / "checkpoint-4" / "optimizer.safetensors"));

  std::ifstream log(out / "logs" / "metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(log, line)) {
    auto record = nlohmann::json::parse(line);
    EXPECT_EQ(record["step"], ++lines);
    EXPECT_DOUBLE_EQ(record["lr"].get<double>(), 2e-3 * 2);  // --scale_lr: x batch 2 x accumulation 1 x 1 rank
    EXPECT_GT(record["images_per_s"].get<double>(), 0);
  }
  EXPECT_EQ(lines, 4);

  // The full pipeline knows the token, and its embedding row is the learned one.
  pipeline::StableDiffusion pipe = pipeline::load_pipeline(out);
  auto id = pipe.tokenizer.token_to_id("<dicoo>");
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(*id, 49408);
  auto learned = io::load_safetensors(out / "learned_embeds.safetensors").at("<dicoo>");
  EXPECT_TRUE(at::equal(pipe.text_encoder->token_embedding()->weight[*id], learned[0]));
  auto toy = pipe.tokenizer.encode_tokens("toy").at(0);
  EXPECT_FALSE(at::equal(learned[0], pipe.text_encoder->token_embedding()->weight[toy])) << "the embedding moved";

  // Validation images at step 4 (25 DPM-Solver++ steps at the training resolution).
  EXPECT_EQ(io::load_image_rgb(out / "validation" / "step-4-0.png").width, 32);
  EXPECT_TRUE(fs::exists(out / "validation" / "step-4-1.png"));

  // Generation with what was trained: the base model plus the embedding file, and the saved full pipeline.
  auto with_embeds = run_command(sdtrain("generate --model " + model().string() + " --embeddings " +
                                         (out / "learned_embeds.safetensors").string() +
                                         " --prompt 'a <dicoo> on a table' --num_inference_steps 3 --height 32"
                                         " --width 32 --seed 3 --threads 1 --output_dir " +
                                         (out / "gen").string()));
  ASSERT_EQ(with_embeds.exit_code, 0) << with_embeds.output;
  EXPECT_TRUE(fs::exists(out / "gen" / "p0-s3-i0.png")) << with_embeds.output;
  auto full = run_command(sdtrain("generate --model " + out.string() +
                                  " --prompt 'a <dicoo> on a table'"
                                  " --num_inference_steps 3 --height 32 --width 32 --seed 3 --threads 1 --output_dir " +
                                  (out / "gen-full").string()));
  ASSERT_EQ(full.exit_code, 0) << full.output;
  // Both routes put the same rows behind the same ids, so they generate the same image.
  EXPECT_EQ(io::read_text_file(out / "gen" / "p0-s3-i0.png"), io::read_text_file(out / "gen-full" / "p0-s3-i0.png"));
}

TEST_F(TextualInversionE2E, ResumeFromLatestIsBitIdenticalToAnUninterruptedRun) {
  const fs::path whole = out_.path() / "whole", split = out_.path() / "split";
  auto a = run_command(sdtrain(train_args(whole, "--max_train_steps=6 --gradient_accumulation_steps=2")));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  auto b1 = run_command(
      sdtrain(train_args(split, "--max_train_steps=3 --checkpointing_steps=3 --gradient_accumulation_steps=2")));
  ASSERT_EQ(b1.exit_code, 0) << b1.output;
  auto b2 = run_command(sdtrain(train_args(split,
                                           "--max_train_steps=6 --gradient_accumulation_steps=2 "
                                           "--resume_from_checkpoint latest")));
  ASSERT_EQ(b2.exit_code, 0) << b2.output;
  EXPECT_NE(b2.output.find("resuming from"), std::string::npos) << b2.output;
  EXPECT_EQ(io::read_text_file(whole / "learned_embeds.safetensors"),
            io::read_text_file(split / "learned_embeds.safetensors"));
}

TEST_F(TextualInversionE2E, MultiVectorStyle) {
  auto r = run_command(sdtrain(train_args(out_.path(),
                                          "--max_train_steps=2 --num_vectors=3 --learnable_property=style "
                                          "--mixed_precision=bf16")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  io::SafeTensorsFile embeds(out_.path() / "learned_embeds.safetensors");
  EXPECT_EQ(embeds.entry("<dicoo>").shape, (std::vector<int64_t>{3, 32}));
}

TEST_F(TextualInversionE2E, NoSafeSerializationWritesTorchSaveFiles) {
  auto r = run_command(sdtrain(train_args(out_.path(), "--max_train_steps=2 --save_steps=1 --no_safe_serialization")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(out_.path() / "learned_embeds-steps-1.bin"));
  EXPECT_FALSE(fs::exists(out_.path() / "learned_embeds.safetensors"));
  pipeline::EmbeddingFile e = pipeline::load_embedding_file(out_.path() / "learned_embeds.bin");
  EXPECT_EQ(e.token, "<dicoo>");
  EXPECT_EQ(e.vectors.sizes(), (std::vector<int64_t>{1, 32}));
}

TEST_F(TextualInversionE2E, PythonOnlyFlagsAreAcceptedWithANote) {
  auto r = run_command(sdtrain(train_args(out_.path(),
                                          "--max_train_steps=1 --push_to_hub --hub_token=abc --allow_tf32 "
                                          "--revision=main --mixed_precision=fp16")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // --revision is a real flag, which a local folder ignores (as diffusers does).
  EXPECT_EQ(r.output.find("--revision"), std::string::npos) << r.output;
  for (const char* flag : {"--push_to_hub", "--hub_token", "--allow_tf32"})
    EXPECT_NE(r.output.find(std::string("sdtrain: note: ") + flag), std::string::npos) << flag << "\n" << r.output;
  EXPECT_NE(r.output.find("--mixed_precision fp16: CPUs have no fast float16 kernels"), std::string::npos) << r.output;
}

// The seed deployment's command line as it is written, Hub name and all, on a machine whose Hugging Face cache holds
// the model: here tiny-sd1 as refs/main (safetensors) and, at another commit, as torch.save .bin files. Only the
// resolution is scaled to the tiny model (its VAE downsamples 4x, so 512 would train a 128x128-latent UNet).
TEST(TextualInversionSeedLine, RunsWithACachedHubName) {
  sd::test::TempDir dir;
  const std::string main_commit = "39593d5650112b4cc580433f6b0435385882d819";
  const std::string bin_commit = "aa9ba505e1973ae5cd05f5aedd345178f52f8e6a";
  const fs::path cache = dir.path() / "hub";
  sd::test::add_to_hub_cache(cache, "runwayml/stable-diffusion-v1-5", sd::test::fixtures() / "tiny-sd1", main_commit,
                             "main");
  sd::test::add_to_hub_cache(cache, "runwayml/stable-diffusion-v1-5", sd::test::fixtures() / "formats" / "tiny-sd1-bin",
                             bin_commit, "bin-weights");
  for (int i = 0; i < 3; ++i)
    sd::test::write_pattern_png(dir.path() / "dicoo" / ("img" + std::to_string(i) + ".png"), 70, 60, 7 + i);
  const auto seed_line = [&](const std::string& output_dir, const std::string& extra) {
    return run_command("cd '" + dir.path().string() + "' && HF_HUB_CACHE='" + cache.string() + "' " +
                       sdtrain("textual-inversion --pretrained_model_name_or_path=runwayml/stable-diffusion-v1-5"
                               " --train_data_dir=dicoo --learnable_property=object --placeholder_token=\"<dicoo>\""
                               " --initializer_token=toy --resolution=64 --train_batch_size=1 --seed=7"
                               " --gradient_accumulation_steps=1 --max_train_steps=30 --learning_rate=2.0e-03 "
                               "--scale_lr --lr_scheduler=constant --lr_warmup_steps=0 --output_dir=" +
                               output_dir + " --mixed_precision=bf16 --save_as_full_pipeline --threads 1 " + extra));
  };

  auto r = seed_line("out", "");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path out = dir.path() / "out";
  EXPECT_EQ(io::SafeTensorsFile(out / "learned_embeds.safetensors").names(), std::vector<std::string>{"<dicoo>"});
  // The full pipeline holds the cached UNet and VAE as files of its own, not links into the cache.
  for (const char* file : {"unet/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.safetensors"}) {
    EXPECT_FALSE(fs::is_symlink(out / file)) << file;
    EXPECT_EQ(io::read_text_file(out / file), io::read_text_file(sd::test::fixtures() / "tiny-sd1" / file)) << file;
  }

  // --revision by branch and by commit: the .bin snapshot holds the same weights, so training learns the same bits.
  for (const std::string& revision : {std::string("bin-weights"), bin_commit}) {
    r = seed_line("out-" + revision, "--revision=" + revision);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(io::read_text_file(dir.path() / ("out-" + revision) / "learned_embeds.safetensors"),
              io::read_text_file(out / "learned_embeds.safetensors"))
        << revision;
  }

  // A revision the cache does not hold: one line naming where sdtrain looked and how to fetch it.
  r = seed_line("never", "--revision=fp16");
  EXPECT_TRUE(sd::test::is_one_line_error(
      r, (cache / "models--runwayml--stable-diffusion-v1-5" / "refs" / "fp16").string() + ")"));
  EXPECT_NE(r.output.find("huggingface-cli download runwayml/stable-diffusion-v1-5 --revision fp16"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir.path() / "never"));
}

void expect_one_line_error(const sd::test::CommandResult& r, const std::string& fragment) {
  EXPECT_TRUE(sd::test::is_one_line_error(r, fragment));
}

TEST_F(TextualInversionE2E, BadInputs) {
  const fs::path out = out_.path();
  expect_one_line_error(run_command(sdtrain(train_args(out, "--max_train_steps=1 --placeholder_token=toy"))),
                        "the tokenizer already contains the token 'toy'");
  expect_one_line_error(run_command(sdtrain(train_args(out, "--max_train_steps=1 --initializer_token='red car'"))),
                        "--initializer_token 'red car' must be a single token, but it is 2 tokens");
  sd::test::TempDir empty;
  expect_one_line_error(
      run_command(sdtrain(train_args(out, "--max_train_steps=1 --train_data_dir=" + empty.path().string()))),
      "no images");
  expect_one_line_error(run_command(sdtrain(train_args(out, "--max_train_steps=1 --train_data_dir=/nonexistent/x"))),
                        "--train_data_dir /nonexistent/x: not a directory");
  expect_one_line_error(run_command(sdtrain(train_args(out, "--max_train_steps=1 --resolution=30"))),
                        "--resolution 30 must be divisible by 4");
  auto bad_value = run_command(sdtrain(train_args(out, "--lr_scheduler=exponential")));
  EXPECT_NE(bad_value.exit_code, 0);
  EXPECT_NE(bad_value.output.find("--lr_scheduler"), std::string::npos) << bad_value.output;
  auto bad_precision = run_command(sdtrain(train_args(out, "--mixed_precision=fp8")));
  EXPECT_NE(bad_precision.exit_code, 0);
  EXPECT_NE(bad_precision.output.find("--mixed_precision"), std::string::npos) << bad_precision.output;
  EXPECT_FALSE(fs::exists(out / "learned_embeds.safetensors"));
}

}  // namespace
}  // namespace sd
