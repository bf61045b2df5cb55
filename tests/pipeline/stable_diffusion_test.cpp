#include "pipeline/stable_diffusion.h"

#include <fstream>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "models/weights.h"
#include "pipeline/presets.h"
#include "test_util.h"

namespace sd::pipeline {
namespace {

namespace fs = std::filesystem;

fs::path copy_fixture(const fs::path& to, const std::string& name = "tiny-sd1") {
  fs::copy(sd::test::fixtures() / name, to / name, fs::copy_options::recursive);
  return to / name;
}

std::string load_error(const fs::path& dir) {
  try {
    load_pipeline(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Pipeline, LoadsBothFixturePipelines) {
  for (const char* name : {"tiny-sd1", "tiny-sd2"}) {
    StableDiffusion pipe = load_pipeline(sd::test::fixtures() / name);
    EXPECT_EQ(pipe.vae_scale_factor(), 4) << name;
    EXPECT_EQ(pipe.tokenizer.model_max_length(), 77);
  }
}

TEST(Pipeline, SaveThenLoadKeepsEveryWeightAndConfig) {
  sd::test::TempDir dir;
  StableDiffusion pipe = load_pipeline(sd::test::fixtures() / "tiny-sd2");
  save_pipeline(pipe, dir.path() / "copy");
  StableDiffusion back = load_pipeline(dir.path() / "copy");
  for (auto* part : {"unet", "vae"}) {
    auto a = io::load_safetensors(sd::test::fixtures() / "tiny-sd2" / part / "diffusion_pytorch_model.safetensors");
    auto b = io::load_safetensors(dir.path() / "copy" / part / "diffusion_pytorch_model.safetensors");
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [name, t] : a) EXPECT_TRUE(at::equal(t, b.at(name))) << part << " " << name;
  }
  for (auto* file : {"unet/config.json", "vae/config.json", "text_encoder/config.json",
                     "scheduler/scheduler_config.json", "tokenizer/tokenizer_config.json"}) {
    auto original = nlohmann::json::parse(io::read_text_file(sd::test::fixtures() / "tiny-sd2" / file));
    auto saved = nlohmann::json::parse(io::read_text_file(dir.path() / "copy" / file));
    for (auto& j : {&original, &saved}) j->erase("_diffusers_version"), j->erase("transformers_version");
    EXPECT_EQ(original, saved) << file;
  }
  EXPECT_EQ(nlohmann::json::parse(io::read_text_file(dir.path() / "copy" / "model_index.json"))["scheduler"][1],
            "DDIMScheduler");
  EXPECT_TRUE(at::equal(back.text_encoder->token_embedding()->weight, pipe.text_encoder->token_embedding()->weight));
}

TEST(Pipeline, MissingModelIndex) {
  sd::test::TempDir dir;
  auto p = copy_fixture(dir.path());
  fs::remove(p / "model_index.json");
  EXPECT_NE(load_error(p).find("not a diffusers pipeline (missing model_index.json)"), std::string::npos);
}

TEST(Pipeline, MissingWeightsFile) {
  sd::test::TempDir dir;
  auto p = copy_fixture(dir.path());
  fs::remove(p / "unet" / "diffusion_pytorch_model.safetensors");
  std::string e = load_error(p);
  EXPECT_NE(e.find("unet/diffusion_pytorch_model.safetensors"), std::string::npos) << e;
}

TEST(Pipeline, TruncatedSafetensors) {
  sd::test::TempDir dir;
  auto p = copy_fixture(dir.path());
  auto file = p / "vae" / "diffusion_pytorch_model.safetensors";
  fs::resize_file(file, fs::file_size(file) - 1000);
  std::string e = load_error(p);
  EXPECT_NE(e.find("vae/diffusion_pytorch_model.safetensors: truncated safetensors file"), std::string::npos) << e;
}

TEST(Pipeline, CorruptSafetensorsHeader) {
  sd::test::TempDir dir;
  auto p = copy_fixture(dir.path());
  auto file = p / "text_encoder" / "model.safetensors";
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(8);
  f.write("!!!!", 4);
  f.close();
  std::string e = load_error(p);
  EXPECT_NE(e.find("text_encoder/model.safetensors: corrupt safetensors header"), std::string::npos) << e;
}

TEST(Pipeline, ConfigWithAWrongType) {
  sd::test::TempDir dir;
  auto p = copy_fixture(dir.path());
  auto config = nlohmann::json::parse(io::read_text_file(p / "unet" / "config.json"));
  config["layers_per_block"] = "two";
  io::write_text_file(p / "unet" / "config.json", config.dump());
  std::string e = load_error(p);
  EXPECT_NE(e.find("unet/config.json: key 'layers_per_block' must be an integer"), std::string::npos) << e;
}

TEST(Pipeline, WeightOfTheWrongShape) {
  sd::test::TempDir dir;
  auto p = copy_fixture(dir.path());
  auto file = p / "unet" / "diffusion_pytorch_model.safetensors";
  auto tensors = io::load_safetensors(file);
  tensors["conv_in.weight"] = at::zeros({32, 4, 5, 5});
  io::save_safetensors(file, tensors);
  std::string e = load_error(p);
  EXPECT_NE(e.find("diffusion_pytorch_model.safetensors: weights do not match the model config: wrong shape: "
                   "conv_in.weight (file [32, 4, 5, 5], model [32, 4, 3, 3])"),
            std::string::npos)
      << e;
}

TEST(Pipeline, WeightOfAnIntegerDtype) {
  sd::test::TempDir dir;
  auto p = copy_fixture(dir.path());
  auto file = p / "unet" / "diffusion_pytorch_model.safetensors";
  auto tensors = io::load_safetensors(file);
  tensors["conv_in.bias"] = tensors["conv_in.bias"].to(at::kInt);
  io::save_safetensors(file, tensors);
  std::string e = load_error(p);
  EXPECT_NE(e.find("diffusion_pytorch_model.safetensors: weights do not match the model config: wrong dtype: "
                   "conv_in.bias (Int in the file, expected a floating-point type)"),
            std::string::npos)
      << e;
}

TEST(Presets, TinyIsTheFixtureArchitectureAndSeeded) {
  sd::test::TempDir dir;
  write_preset("tiny", 3, dir.path() / "a", at::kFloat);
  write_preset("tiny", 3, dir.path() / "b", at::kFloat);
  write_preset("tiny", 4, dir.path() / "c", at::kFloat);
  StableDiffusion a = load_pipeline(dir.path() / "a");
  EXPECT_EQ(models::parameter_count(*a.unet), 2164452);
  EXPECT_EQ(a.tokenizer.encode("a photo of a cat")[1], 320);
  const fs::path unet = "unet/diffusion_pytorch_model.safetensors";
  EXPECT_EQ(io::read_text_file(dir.path() / "a" / unet), io::read_text_file(dir.path() / "b" / unet));
  EXPECT_NE(io::read_text_file(dir.path() / "a" / unet), io::read_text_file(dir.path() / "c" / unet));
  EXPECT_FALSE(fs::exists(dir.path() / "a.init-tmp"));
}

TEST(Presets, UnknownPresetWritesNothing) {
  sd::test::TempDir dir;
  EXPECT_THROW(write_preset("sd3", 0, dir.path() / "x", at::kFloat), Error);
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

}  // namespace
}  // namespace sd::pipeline
