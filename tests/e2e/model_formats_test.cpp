// The model files people have, through the binary: a torch.save .bin pipeline, a single-file checkpoint and a
// cached Hub name generate exactly tiny-sd1's images; `sdtrain convert` goes to the single file and back and writes
// an fp16 variant that loads; training from a single file or a cached Hub name (--revision, --variant) writes whole
// pipelines; inspect reads every format; a VAE given apart (--vae) in any of its forms; a pickle that would run code
// is refused with one line before anything is written.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "io/hub_cache_util.h"
#include "io/safetensors.h"
#include "io/torch_zip_util.h"
#include "models/weights.h"
#include "pipeline/stable_diffusion.h"
#include "test_util.h"

namespace sd {
namespace {

namespace fs = std::filesystem;
using sd::test::fixtures;
using sd::test::TempDir;

std::string quote(const fs::path& p) { return "'" + p.string() + "'"; }

sd::test::CommandResult sdtrain(const std::string& args) {
  return sd::test::run_command(sd::test::sdtrain_binary() + " " + args);
}

// The images `generate` makes from `model_args` (2 steps, fixed seed), as the raw float tensor.
at::Tensor generated(const std::string& model_args, const fs::path& dir, const std::string& env = "") {
  const fs::path raw = dir / "raw.safetensors";
  const auto r = sd::test::run_command(env + sd::test::sdtrain_binary() + " generate " + model_args +
                                       " --prompt 'a red cube' --num_inference_steps 2 --seed 3 --threads 1"
                                       " --output_dir '' --save_raw " +
                                       quote(raw));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.exit_code == 0 ? io::load_safetensors(raw).at("images") : at::Tensor();
}

void expect_same_tensors(const fs::path& actual, const fs::path& expected) {
  const io::TensorMap a = io::load_safetensors(actual), e = io::load_safetensors(expected);
  ASSERT_EQ(a.size(), e.size()) << actual;
  for (const auto& [name, tensor] : e) {
    ASSERT_TRUE(a.count(name)) << name;
    EXPECT_TRUE(a.at(name).scalar_type() == tensor.scalar_type() && at::equal(a.at(name), tensor)) << name;
  }
}

class ModelFormats : public ::testing::Test {
 protected:
  // What tiny-sd1 itself generates, which every other form of it must reproduce.
  const at::Tensor& reference() {
    if (!reference_.defined()) reference_ = generated("--model " + quote(fixtures() / "tiny-sd1"), dir_.path());
    return reference_;
  }
  TempDir dir_;

 private:
  at::Tensor reference_;
};

TEST_F(ModelFormats, BinPipelineGeneratesTheSameImages) {
  const at::Tensor images = generated("--model " + quote(fixtures() / "formats" / "tiny-sd1-bin"), dir_.path());
  EXPECT_TRUE(images.defined() && at::equal(images, reference()));
}

TEST_F(ModelFormats, SingleFileGeneratesTheSameImages) {
  const fs::path file = fixtures() / "formats" / "tiny-sd1-ldm.safetensors";
  EXPECT_TRUE(at::equal(generated("--model " + quote(file), dir_.path()), reference()));
  EXPECT_TRUE(
      at::equal(generated("--model " + quote(file) + " --config_from " + quote(fixtures() / "tiny-sd1"), dir_.path()),
                reference()));
}

// Older SD-1 checkpoints hold CLIP's layers as cond_stage_model.transformer.encoder.* (no text_model. level), as A1111
// also reads them.
TEST_F(ModelFormats, SingleFileWithTheOlderTextEncoderKeysGeneratesTheSameImages) {
  const std::string current = "cond_stage_model.transformer.text_model.", older = "cond_stage_model.transformer.";
  io::TensorMap renamed;
  for (const auto& [key, tensor] : io::load_safetensors(fixtures() / "formats" / "tiny-sd1-ldm.safetensors"))
    renamed[key.rfind(current, 0) == 0 ? older + key.substr(current.size()) : key] = tensor;
  ASSERT_TRUE(renamed.count(older + "encoder.layers.0.self_attn.q_proj.weight"));
  const fs::path file = dir_.path() / "older.safetensors";
  io::save_safetensors(file, renamed);
  EXPECT_TRUE(at::equal(generated("--model " + quote(file), dir_.path()), reference()));
}

TEST_F(ModelFormats, CachedHubNameGeneratesTheSameImages) {
  sd::test::add_to_hub_cache(dir_.path() / "hub", "sdtrain-test/tiny-sd1", fixtures() / "tiny-sd1",
                             "0123456789abcdef0123456789abcdef01234567", "main");
  const std::string env = "HF_HUB_CACHE=" + quote(dir_.path() / "hub") + " ";
  EXPECT_TRUE(at::equal(generated("--model sdtrain-test/tiny-sd1", dir_.path(), env), reference()));

  const auto r = sd::test::run_command(env + sd::test::sdtrain_binary() +
                                       " generate --model sdtrain-test/absent --prompt x --output_dir " +
                                       quote(dir_.path() / "never"));
  EXPECT_TRUE(sd::test::is_one_line_error(r, "huggingface-cli download sdtrain-test/absent"));
  EXPECT_FALSE(fs::exists(dir_.path() / "never"));
}

TEST_F(ModelFormats, ConvertToTheSingleFileAndBack) {
  const fs::path single = dir_.path() / "tiny.safetensors", back = dir_.path() / "back";
  auto r = sdtrain("convert " + quote(fixtures() / "tiny-sd1") + " " + quote(single));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_tensors(single, fixtures() / "formats" / "tiny-sd1-ldm.safetensors");

  r = sdtrain("convert " + quote(fixtures() / "formats" / "tiny-sd1-ldm.safetensors") + " " + quote(back) +
              " --config_from " + quote(fixtures() / "tiny-sd1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* file : {"unet/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.safetensors",
                           "text_encoder/model.safetensors"})
    expect_same_tensors(back / file, fixtures() / "tiny-sd1" / file);
  EXPECT_TRUE(at::equal(generated("--model " + quote(back), dir_.path()), reference()));

  // The round trip from the single file, its configs detected this time: back to that file's own tensors.
  const fs::path detected = dir_.path() / "detected", again = dir_.path() / "again.safetensors";
  r = sdtrain("convert " + quote(fixtures() / "formats" / "tiny-sd1-ldm.safetensors") + " " + quote(detected));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = sdtrain("convert " + quote(detected) + " " + quote(again));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_tensors(again, fixtures() / "formats" / "tiny-sd1-ldm.safetensors");
}

// --vae: a VAE given apart, in each form people hold one - alone in the original layout (as
// vae-ft-mse-840000-ema-pruned.safetensors is shipped), a diffusers VAE folder (stabilityai/sd-vae-ft-mse) or its
// weights file, a pipeline folder, a whole checkpoint - generates exactly what a pipeline holding that VAE does, and
// convert --vae writes it in.
TEST_F(ModelFormats, AVaeGivenApartGeneratesWhatAPipelineHoldingItDoes) {
  // The other VAE: tiny-sd1's with its decoder's last bias moved, so that its images differ.
  const std::string moved = "decoder.conv_out.bias";
  const fs::path pipeline = dir_.path() / "with-other-vae";
  fs::copy(fixtures() / "tiny-sd1", pipeline, fs::copy_options::recursive);
  const fs::path vae_weights = pipeline / "vae" / "diffusion_pytorch_model.safetensors";
  io::TensorMap vae = io::load_safetensors(vae_weights);
  vae[moved] = vae.at(moved) + 0.25;
  io::save_safetensors(vae_weights, vae);
  const at::Tensor expected = generated("--model " + quote(pipeline), dir_.path());
  ASSERT_TRUE(expected.defined() && !at::allclose(expected, reference()));

  // The same VAE in the original layout: the fixture checkpoint with that bias moved, and its VAE part alone.
  io::TensorMap checkpoint = io::load_safetensors(fixtures() / "formats" / "tiny-sd1-ldm.safetensors"), alone;
  checkpoint["first_stage_model." + moved] = checkpoint.at("first_stage_model." + moved) + 0.25;
  const std::string prefix = "first_stage_model.";
  for (const auto& [key, tensor] : checkpoint)
    if (key.rfind(prefix, 0) == 0) alone[key.substr(prefix.size())] = tensor;
  const fs::path checkpoint_file = dir_.path() / "other.safetensors", alone_file = dir_.path() / "vae-ft.safetensors";
  io::save_safetensors(checkpoint_file, checkpoint);
  io::save_safetensors(alone_file, alone);

  for (const fs::path& given : {alone_file, pipeline / "vae", vae_weights, pipeline, checkpoint_file}) {
    SCOPED_TRACE(given.string());
    const at::Tensor images =
        generated("--model " + quote(fixtures() / "tiny-sd1") + " --vae " + quote(given), dir_.path());
    EXPECT_TRUE(images.defined() && at::equal(images, expected));
  }

  const fs::path converted = dir_.path() / "converted";
  auto r =
      sdtrain("convert " + quote(fixtures() / "tiny-sd1") + " " + quote(converted) + " --vae " + quote(alone_file));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_tensors(converted / "vae" / "diffusion_pytorch_model.safetensors", vae_weights);

  // What is not a VAE, or not one this model can use, stops before any image or file is written.
  const fs::path wide_vae = dir_.path() / "wide-vae";
  fs::copy(pipeline / "vae", wide_vae, fs::copy_options::recursive);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(wide_vae / "config.json"));
  config["latent_channels"] = 8;
  std::ofstream(wide_vae / "config.json") << config.dump();
  const std::string lora = sd::test::golden("tiny-sd1/lora_diffusers.safetensors").string();
  for (const auto& [given, error] : std::vector<std::pair<std::string, std::string>>{
           {(dir_.path() / "none").string(), "--vae " + (dir_.path() / "none").string() + ": no such file or folder"},
           {lora, lora + ": not a VAE (expected a checkpoint's first_stage_model.* tensors, or a VAE's encoder.* and "
                         "decoder.* tensors in the original or the diffusers layout)"},
           {wide_vae.string(),
            wide_vae.string() + ": a VAE of 8 latent channels at 1/4 of the image size; the model's has 4 at 1/4"},
           {dir_.path().string(), dir_.path().string() +
                                      ": not a VAE folder (no config.json) nor a pipeline folder (no "
                                      "model_index.json)"}}) {
    SCOPED_TRACE(given);
    r = sdtrain("generate --model " + quote(fixtures() / "tiny-sd1") + " --prompt x --num_inference_steps 1 --vae " +
                quote(given) + " --output_dir " + quote(dir_.path() / "never"));
    EXPECT_TRUE(sd::test::is_one_line_error(r, error)) << r.output;
    EXPECT_FALSE(fs::exists(dir_.path() / "never"));
  }
}

TEST_F(ModelFormats, Fp16VariantIsWrittenAndLoads) {
  const fs::path out = dir_.path() / "fp16";
  auto r = sdtrain("convert " + quote(fixtures() / "tiny-sd1") + " " + quote(out) + " --variant fp16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const io::TensorMap unet = io::load_safetensors(out / "unet" / "diffusion_pytorch_model.fp16.safetensors");
  const io::TensorMap source =
      io::load_safetensors(fixtures() / "tiny-sd1" / "unet" / "diffusion_pytorch_model.safetensors");
  EXPECT_TRUE(at::equal(unet.at("conv_in.weight"), source.at("conv_in.weight").to(at::kHalf)));
  EXPECT_TRUE(fs::exists(out / "text_encoder" / "model.fp16.safetensors"));
  EXPECT_FALSE(fs::exists(out / "unet" / "diffusion_pytorch_model.safetensors"));
  const at::Tensor images = generated("--model " + quote(out) + " --variant fp16", dir_.path());
  ASSERT_TRUE(images.defined());
  EXPECT_LT((images - reference()).abs().max().item<double>(), 0.05);  // fp16 weights, float32 compute

  r = sdtrain("generate --model " + quote(out) + " --prompt x --output_dir " + quote(dir_.path() / "never"));
  EXPECT_TRUE(sd::test::is_one_line_error(r, "--variant"));
  r = sdtrain("generate --model " + quote(fixtures() / "tiny-sd1") + " --variant fp32 --prompt x --output_dir " +
              quote(dir_.path() / "never"));
  EXPECT_TRUE(sd::test::is_one_line_error(r, "no component has weights of variant 'fp32'"));
  EXPECT_FALSE(fs::exists(dir_.path() / "never"));
}

// Every component of `actual` holds the weights tiny-sd1 holds (whatever files they were written as).
void expect_tiny_sd1_components(const fs::path& actual, const std::vector<std::string>& components) {
  pipeline::StableDiffusion expected = pipeline::load_pipeline(fixtures() / "tiny-sd1");
  pipeline::StableDiffusion loaded = pipeline::load_pipeline(actual);
  const std::map<std::string, std::pair<const torch::nn::Module*, const torch::nn::Module*>> modules = {
      {"unet", {loaded.unet.get(), expected.unet.get()}},
      {"vae", {loaded.vae.get(), expected.vae.get()}},
      {"text_encoder", {loaded.text_encoder.get(), expected.text_encoder.get()}}};
  for (const auto& component : components) {
    const auto& [actual_module, expected_module] = modules.at(component);
    const io::TensorMap weights = models::named_weights(*actual_module);
    for (const auto& [name, tensor] : models::named_weights(*expected_module))
      EXPECT_TRUE(at::equal(weights.at(name), tensor)) << component << " " << name;
  }
}

TEST_F(ModelFormats, TrainingFromASingleFileWritesTheFrozenComponents) {
  const fs::path file = fixtures() / "formats" / "tiny-sd1-ldm.safetensors", out = dir_.path() / "unet-out";
  auto r = sdtrain("train --pretrained_model_name_or_path " + quote(file) +
                   " --synthetic_data latents --synthetic_samples 8 --resolution 64 --train_batch_size 1 "
                   "--max_train_steps 1 --seed 1"
                   " --threads 1 --output_dir " +
                   quote(out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_tiny_sd1_components(out, {"vae", "text_encoder"});

  const fs::path images = dir_.path() / "images", embeds = dir_.path() / "ti-out";
  for (int i = 0; i < 2; ++i) sd::test::write_pattern_png(images / fmt::format("img{}.png", i), 40, 40, 5 + i);
  r = sdtrain("textual-inversion --pretrained_model_name_or_path " + quote(file) + " --train_data_dir " +
              quote(images) +
              " --placeholder_token '<cube>' --initializer_token toy --resolution 32 --train_batch_size 1"
              " --max_train_steps 1 --seed 1 --threads 1 --save_as_full_pipeline --output_dir " +
              quote(embeds));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_tiny_sd1_components(embeds, {"unet", "vae"});
}

TEST_F(ModelFormats, TrainingTakesTheRevisionAndVariantOfACachedHubName) {
  // Revision "fp16" of the cached repository holds the UNet only as a variant file (Hub repositories do so).
  const fs::path variant = dir_.path() / "variant";
  fs::copy(fixtures() / "tiny-sd1", variant, fs::copy_options::recursive);
  fs::rename(variant / "unet" / "diffusion_pytorch_model.safetensors",
             variant / "unet" / "diffusion_pytorch_model.fp16.safetensors");
  sd::test::add_to_hub_cache(dir_.path() / "hub", "sdtrain-test/tiny-sd1", variant,
                             "fedcba9876543210fedcba9876543210fedcba98", "fp16");
  const std::string command =
      "HF_HUB_CACHE=" + quote(dir_.path() / "hub") + " " + sd::test::sdtrain_binary() +
      " train --pretrained_model_name_or_path sdtrain-test/tiny-sd1 --revision fp16"
      " --synthetic_data latents --synthetic_samples 8 --resolution 64 --train_batch_size 1 --max_train_steps 1"
      " --seed 1 --threads 1"
      " --output_dir " +
      quote(dir_.path() / "out");
  EXPECT_TRUE(sd::test::is_one_line_error(sd::test::run_command(command), "--variant"));
  const auto r = sd::test::run_command(command + " --variant fp16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The frozen components are real files, not links into the cache.
  EXPECT_FALSE(fs::is_symlink(dir_.path() / "out" / "vae" / "diffusion_pytorch_model.safetensors"));
  expect_tiny_sd1_components(dir_.path() / "out", {"vae", "text_encoder"});
}

TEST_F(ModelFormats, InspectReadsEveryFormat) {
  for (const fs::path& model : {fixtures() / "tiny-sd1", fixtures() / "formats" / "tiny-sd1-bin",
                                fixtures() / "formats" / "tiny-sd1-ldm.safetensors"}) {
    const auto r = sdtrain("inspect " + quote(model));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("unet          UNet2DConditionModel         2.164452 M params  float32"), std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("Model has 4.737444 M parameters and 2.164452 M trainable"), std::string::npos) << r.output;
  }
}

TEST_F(ModelFormats, CodeRunningPickleIsRefusedBeforeAnythingRuns) {
  const fs::path model = dir_.path() / "evil";
  fs::copy(fixtures() / "formats" / "tiny-sd1-bin", model, fs::copy_options::recursive);
  const fs::path marker = dir_.path() / "pwned";
  const std::string pickle =
      "\x80\x02"
      "cos\nsystem\n" +
      sd::test::pickle_unicode("touch " + marker.string()) + "\x85R.";
  sd::test::write_bytes(model / "unet" / "diffusion_pytorch_model.bin", sd::test::torch_archive(pickle, ""));
  const auto r = sdtrain("generate --model " + quote(model) + " --prompt x --output_dir " + quote(dir_.path() / "out"));
  EXPECT_TRUE(sd::test::is_one_line_error(r, "refusing to load: the pickle asks for the Python object 'os.system'"));
  EXPECT_NE(r.output.find((model / "unet" / "diffusion_pytorch_model.bin").string()), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(marker));
  EXPECT_FALSE(fs::exists(dir_.path() / "out"));
}

}  // namespace
}  // namespace sd
