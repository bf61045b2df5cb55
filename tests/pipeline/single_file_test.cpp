// Single-file (LDM / A1111) checkpoints: the fixture written by diffusers' conversion script loads to tiny-sd1's
// tensors bit for bit (with tiny-sd1's configs, or with the detected preset), converting back reproduces that file,
// SD-2's OpenCLIP layout round-trips, and .ckpt files (Lightning zip-pickles) load the same way.
#include "pipeline/single_file.h"

#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <fstream>

#include "core/error.h"
#include "io/safetensors.h"
#include "models/weights.h"
#include "test_util.h"

namespace sd::pipeline {
namespace {

namespace fs = std::filesystem;
using sd::test::fixtures;
using sd::test::TempDir;

fs::path ldm_fixture() { return fixtures() / "formats" / "tiny-sd1-ldm.safetensors"; }

void expect_same_weights(const torch::nn::Module& actual, const torch::nn::Module& expected) {
  const io::TensorMap a = models::named_weights(actual), e = models::named_weights(expected);
  ASSERT_EQ(a.size(), e.size());
  for (const auto& [name, tensor] : e) {
    ASSERT_TRUE(a.count(name)) << name;
    EXPECT_TRUE(at::equal(a.at(name), tensor)) << name;
  }
}

void expect_same_pipeline(StableDiffusion& actual, StableDiffusion& expected) {
  expect_same_weights(*actual.unet, *expected.unet);
  expect_same_weights(*actual.vae, *expected.vae);
  expect_same_weights(*actual.text_encoder, *expected.text_encoder);
  EXPECT_EQ(actual.tokenizer.encode("a photo of an astronaut"), expected.tokenizer.encode("a photo of an astronaut"));
  EXPECT_EQ(actual.scheduler_config.to_json("PNDMScheduler"), expected.scheduler_config.to_json("PNDMScheduler"));
}

void expect_same_files(const fs::path& actual, const fs::path& expected) {
  const io::TensorMap a = io::load_safetensors(actual), e = io::load_safetensors(expected);
  ASSERT_EQ(a.size(), e.size());
  for (const auto& [name, tensor] : e) {
    ASSERT_TRUE(a.count(name)) << name;
    EXPECT_EQ(a.at(name).scalar_type(), tensor.scalar_type()) << name;
    EXPECT_TRUE(a.at(name).sizes() == tensor.sizes() && at::equal(a.at(name), tensor)) << name;
  }
}

TEST(SingleFile, LdmFixtureLoadsToTinySd1BitForBit) {
  StableDiffusion expected = load_pipeline(fixtures() / "tiny-sd1");
  StableDiffusion with_configs = load_single_file(ldm_fixture(), fixtures() / "tiny-sd1");
  expect_same_pipeline(with_configs, expected);
  // Without configs the weights are matched to a preset: tiny is tiny-sd1's architecture.
  StableDiffusion detected = load_single_file(ldm_fixture(), "");
  expect_same_pipeline(detected, expected);
  EXPECT_EQ(detected.unet->config().to_json(), expected.unet->config().to_json());
}

TEST(SingleFile, ConvertingBackReproducesTheFixture) {
  StableDiffusion pipe = load_pipeline(fixtures() / "tiny-sd1");
  TempDir dir;
  save_single_file(pipe, dir.path() / "tiny.safetensors");
  expect_same_files(dir.path() / "tiny.safetensors", ldm_fixture());
}

TEST(SingleFile, Sd2OpenClipLayoutRoundTrips) {
  StableDiffusion pipe = load_pipeline(fixtures() / "tiny-sd2");
  TempDir dir;
  save_single_file(pipe, dir.path() / "sd2.safetensors");
  io::SafeTensorsFile file(dir.path() / "sd2.safetensors");
  EXPECT_TRUE(file.contains("cond_stage_model.model.transformer.resblocks.0.attn.in_proj_weight"));
  EXPECT_FALSE(file.contains("cond_stage_model.transformer.text_model.final_layer_norm.weight"));
  StableDiffusion back = load_single_file(dir.path() / "sd2.safetensors", fixtures() / "tiny-sd2");
  expect_same_pipeline(back, pipe);
  // SD-1 configs cannot describe an OpenCLIP text encoder: one line says so.
  try {
    load_single_file(dir.path() / "sd2.safetensors", fixtures() / "tiny-sd1");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("OpenCLIP"), std::string::npos) << e.what();
  }
}

TEST(SingleFile, LightningCkptLoadsLikeTheSafetensorsFile) {
  // {"state_dict": {...}, "global_step": N} as PyTorch Lightning saves it, written by LibTorch's torch.save.
  c10::impl::GenericDict state(c10::StringType::get(), c10::TensorType::get());
  for (const auto& [name, tensor] : io::load_safetensors(ldm_fixture())) state.insert(name, tensor);
  state.insert("model_ema.decay", at::tensor(0.9999));  // an EMA entry diffusers leaves out
  c10::impl::GenericDict root(c10::StringType::get(), c10::AnyType::get());
  root.insert("state_dict", state);
  root.insert("global_step", int64_t{470000});
  TempDir dir;
  const std::vector<char> bytes = torch::pickle_save(root);
  std::ofstream(dir.path() / "tiny.ckpt", std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  StableDiffusion from_ckpt = load_single_file(dir.path() / "tiny.ckpt", fixtures() / "tiny-sd1");
  StableDiffusion expected = load_pipeline(fixtures() / "tiny-sd1");
  expect_same_pipeline(from_ckpt, expected);
}

TEST(SingleFile, UnknownArchitecturesAndOtherFilesGetOneLine) {
  TempDir dir;
  io::TensorMap tensors = io::load_safetensors(ldm_fixture());
  tensors.erase("model.diffusion_model.out.2.bias");
  io::save_safetensors(dir.path() / "odd.safetensors", tensors);
  try {
    load_single_file(dir.path() / "odd.safetensors", "");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--config_from"), std::string::npos) << e.what();
  }
  try {
    load_single_file(dir.path() / "odd.safetensors", fixtures() / "tiny-sd1");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(unet part)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("conv_out.bias"), std::string::npos) << e.what();
  }
  try {
    load_single_file(fixtures() / "tiny-sd1" / "unet" / "diffusion_pytorch_model.safetensors", "");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a single-file Stable Diffusion checkpoint"), std::string::npos);
  }
}

}  // namespace
}  // namespace sd::pipeline
