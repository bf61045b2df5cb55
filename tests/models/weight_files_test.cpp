// Which weight files a component folder loads, as diffusers 0.24 / transformers 4.35 pick them: safetensors before
// .bin, variants (fp16) with the per-component fallback, sharded checkpoints (*.index.json) of either format.
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/serialize.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "models/unet/unet_2d_condition.h"
#include "models/weights.h"
#include "test_util.h"

namespace sd::models {
namespace {

namespace fs = std::filesystem;
using sd::test::fixtures;
using sd::test::TempDir;

void expect_weights_equal(const torch::nn::Module& module, const io::TensorMap& expected) {
  const io::TensorMap actual = named_weights(module);
  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& [name, tensor] : expected) EXPECT_TRUE(at::equal(actual.at(name), tensor.to(at::kFloat))) << name;
}

// The tiny-sd1 UNet weights split into two shards with an index, as save_pretrained(max_shard_size=...) writes them:
// <shard_stem>-0000k-of-00002<shard_ext>, the stem carrying the variant ("diffusion_pytorch_model.fp16").
void write_sharded_unet(const fs::path& dir, const std::string& index_name, const std::string& shard_stem,
                        const std::string& shard_ext,
                        const std::function<void(const fs::path&, const io::TensorMap&)>& write_shard) {
  const fs::path source = fixtures() / "tiny-sd1" / "unet";
  fs::create_directories(dir);
  fs::copy_file(source / "config.json", dir / "config.json");
  const io::TensorMap all = io::load_safetensors(source / "diffusion_pytorch_model.safetensors");
  io::TensorMap shards[2];
  nlohmann::json weight_map;
  size_t i = 0;
  for (const auto& [name, tensor] : all) {
    const size_t shard = i++ % 2;
    shards[shard][name] = tensor;
    weight_map[name] = fmt::format("{}-0000{}-of-00002{}", shard_stem, shard + 1, shard_ext);
  }
  for (size_t s = 0; s < 2; ++s)
    write_shard(dir / fmt::format("{}-0000{}-of-00002{}", shard_stem, s + 1, shard_ext), shards[s]);
  io::write_text_file(dir / index_name,
                      nlohmann::json{{"metadata", {{"total_size", 1}}}, {"weight_map", weight_map}}.dump());
}

void write_pickled(const fs::path& path, const io::TensorMap& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : tensors) dict.insert(name, tensor);
  const std::vector<char> bytes = torch::pickle_save(dict);
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(WeightFiles, VariantNamesFollowDiffusers) {
  EXPECT_EQ(with_variant("diffusion_pytorch_model.safetensors", "fp16"), "diffusion_pytorch_model.fp16.safetensors");
  EXPECT_EQ(with_variant("model.safetensors.index.json", "fp16"), "model.safetensors.index.fp16.json");
  EXPECT_EQ(with_variant("pytorch_model.bin", ""), "pytorch_model.bin");
}

TEST(WeightFiles, SafetensorsIsPreferredOverBin) {
  TempDir dir;
  const fs::path unet = dir.path() / "unet";
  fs::copy(fixtures() / "tiny-sd1" / "unet", unet);
  io::write_text_file(unet / "diffusion_pytorch_model.bin", "not read");  // would fail if it were
  const UNet2DConditionModel model = load_unet(unet);
  expect_weights_equal(*model, io::load_safetensors(unet / "diffusion_pytorch_model.safetensors"));
}

TEST(WeightFiles, BinLoadsWhenThereIsNoSafetensors) {
  const UNet2DConditionModel model = load_unet(fixtures() / "formats" / "tiny-sd1-bin" / "unet");
  expect_weights_equal(*model,
                       io::load_safetensors(fixtures() / "tiny-sd1" / "unet" / "diffusion_pytorch_model.safetensors"));
}

TEST(WeightFiles, ShardedSafetensorsAndBinLoad) {
  const io::TensorMap expected =
      io::load_safetensors(fixtures() / "tiny-sd1" / "unet" / "diffusion_pytorch_model.safetensors");
  TempDir dir;
  write_sharded_unet(dir.path() / "st", "diffusion_pytorch_model.safetensors.index.json", "diffusion_pytorch_model",
                     ".safetensors",
                     [](const fs::path& path, const io::TensorMap& t) { io::save_safetensors(path, t); });
  expect_weights_equal(*load_unet(dir.path() / "st"), expected);
  write_sharded_unet(dir.path() / "bin", "diffusion_pytorch_model.bin.index.json", "diffusion_pytorch_model", ".bin",
                     write_pickled);
  expect_weights_equal(*load_unet(dir.path() / "bin"), expected);
  write_sharded_unet(dir.path() / "fp16", "diffusion_pytorch_model.safetensors.index.fp16.json",
                     "diffusion_pytorch_model.fp16", ".safetensors",
                     [](const fs::path& path, const io::TensorMap& t) { io::save_safetensors(path, t); });
  expect_weights_equal(*load_unet(dir.path() / "fp16", at::kFloat, "fp16"), expected);
}

TEST(WeightFiles, BrokenShardIndexesAreOneLine) {
  TempDir dir;
  write_sharded_unet(dir.path(), "diffusion_pytorch_model.safetensors.index.json", "diffusion_pytorch_model",
                     ".safetensors",
                     [](const fs::path& path, const io::TensorMap& t) { io::save_safetensors(path, t); });
  const fs::path index = dir.path() / "diffusion_pytorch_model.safetensors.index.json";
  const auto error_with_index = [&](const nlohmann::json& content) {
    io::write_text_file(index, content.dump());
    try {
      load_unet(dir.path());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(
      error_with_index({{"weight_map", {{"conv_in.weight", "../../etc/passwd"}}}}).find("must be a weights file name"),
      std::string::npos);
  EXPECT_NE(
      error_with_index({{"weight_map", {{"not_in_any.weight", "diffusion_pytorch_model-00001-of-00002.safetensors"}}}})
          .find("which does not hold it"),
      std::string::npos);
  EXPECT_NE(error_with_index({{"weight_map", {{"conv_in.weight", "missing.safetensors"}}}}).find("missing.safetensors"),
            std::string::npos);
  EXPECT_NE(error_with_index({{"no_map", 1}}).find("weight_map"), std::string::npos);
}

TEST(WeightFiles, VariantFallsBackPerComponentAndIsNamedWhenMissing) {
  TempDir dir;
  const fs::path unet = dir.path() / "unet";
  fs::copy(fixtures() / "tiny-sd1" / "unet", unet);
  // No fp16 file in the folder: diffusers loads the plain weights for this component.
  EXPECT_NO_THROW(load_unet(unet, at::kFloat, "fp16"));
  fs::rename(unet / "diffusion_pytorch_model.safetensors", unet / "diffusion_pytorch_model.fp16.safetensors");
  EXPECT_NO_THROW(load_unet(unet, at::kFloat, "fp16"));
  try {
    load_unet(unet);
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find((unet / "diffusion_pytorch_model.safetensors").string() + ": missing file"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("diffusion_pytorch_model.fp16.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--variant"), std::string::npos) << msg;
  }
}

// load_weights hands a stored tensor of the parameter's dtype to the parameter itself (for a large safetensors tensor,
// its copy-on-write mapping): the module's own handles must see it, autograd must still reach it, and training must
// never write to the file.
TEST(LoadWeights, ParametersTakeTheStoredValuesAndStayTrainable) {
  TempDir dir;
  const fs::path path = dir.path() / "linear.safetensors";
  const torch::nn::Linear source(1024, 512);  // a 2 MiB weight: mapped, not copied
  save_weights(*source, path);
  torch::nn::Linear linear(1024, 512);
  load_weights(*linear, path);
  EXPECT_TRUE(at::equal(linear->weight, source->weight));
  EXPECT_TRUE(at::equal(linear->bias, source->bias));
  ASSERT_TRUE(linear->weight.requires_grad());
  linear->forward(torch::ones({1, 1024})).sum().backward();
  ASSERT_TRUE(linear->weight.grad().defined());
  EXPECT_TRUE(at::equal(linear->weight.grad(), torch::ones({512, 1024})));
  {
    torch::NoGradGuard no_grad;
    linear->weight.sub_(linear->weight.grad());
  }
  EXPECT_TRUE(at::equal(linear->weight, source->weight - 1));
  EXPECT_TRUE(at::equal(io::load_safetensors(path).at("weight"), source->weight));
}

TEST(LoadWeights, LargeTensorsOfAnotherDtypeAreConverted) {
  TempDir dir;
  const torch::nn::Linear source(1024, 512);
  save_weights(*source, dir.path() / "bf16.safetensors", at::kBFloat16);
  torch::nn::Linear float32(1024, 512);
  load_weights(*float32, dir.path() / "bf16.safetensors");
  EXPECT_EQ(float32->weight.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(float32->weight, source->weight.to(at::kBFloat16).to(at::kFloat)));

  save_weights(*source, dir.path() / "float32.safetensors");
  torch::nn::Linear bf16(1024, 512);
  bf16->to(at::kBFloat16);
  load_weights(*bf16, dir.path() / "float32.safetensors");
  EXPECT_EQ(bf16->weight.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(bf16->weight, source->weight.to(at::kBFloat16)));
}

}  // namespace
}  // namespace sd::models
