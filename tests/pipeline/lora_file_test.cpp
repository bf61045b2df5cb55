// LoRA files (pipeline/lora_file.h): the names diffusers 0.24 and kohya write, both formats read back to the same
// adapters, the reference file (C11) loads onto tiny-sd1, and one clear line for every bad file.
#include "pipeline/lora_file.h"

#include "io/safetensors.h"
#include "models/lora.h"
#include "models/model_test_util.h"

namespace sd::pipeline {
namespace {

namespace fs = std::filesystem;

StableDiffusion load_tiny() { return load_pipeline(sd::test::fixtures() / "tiny-sd1"); }

const std::string kUNetModule = "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q";
const std::string kConvModule = "down_blocks.0.attentions.0.proj_in";  // a 1x1 conv in SD-1
const std::string kTextModule = "text_model.encoder.layers.0.self_attn.q_proj";

// Rank-2 adapters on a UNet linear (32 -> 32), a UNet 1x1 conv and a text-encoder linear (32 -> 32).
LoraWeights sample_weights(double alpha) {
  at::manual_seed(5);
  return {{LoraComponent::kUNet, kUNetModule, at::randn({2, 32}), at::randn({32, 2}), alpha},
          {LoraComponent::kUNet, kConvModule, at::randn({2, 32, 1, 1}), at::randn({32, 2, 1, 1}), alpha},
          {LoraComponent::kTextEncoder, kTextModule, at::randn({2, 32}), at::randn({32, 2}), alpha}};
}

const LoraModule& find(const LoraWeights& weights, const std::string& module) {
  for (const auto& m : weights)
    if (m.module == module) return m;
  throw std::runtime_error("no module " + module);
}

TEST(LoraFile, DiffusersFormatHasDiffusersNamesAndFoldsAlphaIntoUp) {
  sd::test::TempDir dir;
  const fs::path path = dir.path() / "pytorch_lora_weights.safetensors";
  save_lora_file(path, sample_weights(/*alpha=*/1), LoraFormat::kDiffusers);
  const io::TensorMap t = io::load_safetensors(path);
  EXPECT_EQ(t.size(), 6u);
  const LoraWeights saved = sample_weights(1);
  const LoraModule& q = find(saved, kUNetModule);
  EXPECT_TRUE(at::equal(t.at("unet." + kUNetModule + ".lora.down.weight"), q.down));
  EXPECT_TRUE(at::allclose(t.at("unet." + kUNetModule + ".lora.up.weight"), q.up * 0.5));  // alpha / rank
  EXPECT_TRUE(t.count("unet." + kConvModule + ".lora.up.weight"));
  EXPECT_TRUE(t.count("text_encoder." + kTextModule + ".lora_linear_layer.down.weight"));
  EXPECT_EQ(io::SafeTensorsFile(path).metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));

  StableDiffusion pipe = load_tiny();
  const LoraWeights back = load_lora_file(path, pipe);
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(find(back, kUNetModule).alpha, 2);  // no alpha in the file: alpha = rank
  EXPECT_EQ(find(back, kTextModule).component, LoraComponent::kTextEncoder);
}

TEST(LoraFile, KohyaFormatHasKohyaNamesAlphaAndMetadataAndReadsBack) {
  sd::test::TempDir dir;
  const fs::path path = dir.path() / "kohya.safetensors";
  save_lora_file(path, sample_weights(/*alpha=*/1), LoraFormat::kKohya, {{"ss_network_dim", "2"}});
  const io::SafeTensorsFile file(path);
  EXPECT_EQ(file.names().size(), 9u);
  for (const char* key : {"lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q.lora_down.weight",
                          "lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight",
                          "lora_te_text_model_encoder_layers_0_self_attn_q_proj.alpha"})
    EXPECT_TRUE(file.contains(key)) << key;
  const at::Tensor alpha = file.read("lora_te_text_model_encoder_layers_0_self_attn_q_proj.alpha");
  EXPECT_EQ(alpha.dim(), 0);  // kohya's register_buffer("alpha", torch.tensor(alpha))
  EXPECT_EQ(alpha.item<float>(), 1.0f);
  EXPECT_EQ(file.metadata().at("ss_network_dim"), "2");
  EXPECT_EQ(file.metadata().at("format"), "pt");

  StableDiffusion pipe = load_tiny();
  const LoraWeights back = load_lora_file(path, pipe);
  const LoraWeights original = sample_weights(1);
  ASSERT_EQ(back.size(), original.size());
  for (const auto& m : original) {
    const LoraModule& b = find(back, m.module);
    EXPECT_EQ(b.component, m.component) << m.module;
    EXPECT_TRUE(at::equal(b.down, m.down)) << m.module;
    EXPECT_TRUE(at::equal(b.up, m.up)) << m.module;
    EXPECT_EQ(b.alpha, 1) << m.module;
  }
}

TEST(LoraFile, BothFormatsGiveTheSameOutputs) {
  sd::test::TempDir dir;
  const LoraWeights weights = sample_weights(/*alpha=*/3);
  std::vector<at::Tensor> outputs;
  for (LoraFormat format : {LoraFormat::kDiffusers, LoraFormat::kKohya}) {
    const fs::path path = dir.path() / (format == LoraFormat::kKohya ? "k.safetensors" : "d.safetensors");
    save_lora_file(path, weights, format);
    StableDiffusion pipe = load_tiny();
    attach_lora(pipe, load_lora_file(path, pipe), 0.7, path.string());
    at::manual_seed(6);
    const at::Tensor ids = at::randint(0, 49407, {1, 77}, at::kLong);
    const at::Tensor text = pipe.text_encoder->forward(ids).last_hidden_state;
    outputs.push_back(pipe.unet->forward(at::randn({1, 4, 16, 16}), at::tensor({10}, at::kLong), text).detach());
  }
  EXPECT_TRUE(sd::test::close_rel_max(outputs[1], outputs[0], 1e-6));
}

TEST(LoraFile, ReferenceFileLoadsOntoTinySd1) {
  StableDiffusion pipe = load_tiny();
  const LoraWeights weights = load_lora_file(sd::test::golden("tiny-sd1/lora_diffusers.safetensors"), pipe);
  ASSERT_EQ(weights.size(), 88u);  // attn1/attn2 x to_q/to_k/to_v/to_out.0 of 11 transformer blocks
  for (const auto& m : weights) {
    EXPECT_EQ(m.component, LoraComponent::kUNet);
    EXPECT_EQ(m.alpha, 4);
  }
  attach_lora(pipe, weights, 0.7, "reference");
  EXPECT_EQ(models::adapter_tensors(*pipe.unet).size(), 176u);
}

TEST(LoraFile, BadFilesAreOneLineNamingTheFileAndKey) {
  sd::test::TempDir dir;
  StableDiffusion pipe = load_tiny();
  auto error_for = [&](const io::TensorMap& tensors) {
    const fs::path path = dir.path() / "bad.safetensors";
    io::save_safetensors(path, tensors);
    return sd::test::error_message([&] { attach_lora(pipe, load_lora_file(path, pipe), 1, path.string()); });
  };
  const std::string file = (dir.path() / "bad.safetensors").string();
  const at::Tensor down = at::zeros({2, 32}), up = at::zeros({32, 2});
  EXPECT_EQ(error_for({{"unet." + kUNetModule + ".hada_w1_a", down}}),
            file + ": unknown key 'unet." + kUNetModule +
                ".hada_w1_a' (expected diffusers' unet.<module>.lora.down.weight or kohya's "
                "lora_unet_<module>.lora_down.weight and their text-encoder and up/alpha twins)");
  EXPECT_EQ(error_for({{"lora_unet_down_blocks_9_to_q.lora_down.weight", down}}),
            file +
                ": 'lora_unet_down_blocks_9_to_q.lora_down.weight': the UNet has no Linear or Conv2d layer named "
                "lora_unet_down_blocks_9_to_q");
  EXPECT_EQ(error_for({{"unet." + kUNetModule + ".lora.down.weight", down}}),
            file + ": layer " + kUNetModule + " has a down weight but no up weight");
  EXPECT_EQ(error_for({{"unet.mid.to_q.lora.down.weight", down}, {"unet.mid.to_q.lora.up.weight", up}}),
            file + ": the UNet has no Linear or Conv2d layer 'mid.to_q'");
  EXPECT_EQ(
      error_for(
          {{"unet." + kUNetModule + ".lora.down.weight", down.t()}, {"unet." + kUNetModule + ".lora.up.weight", up}}),
      file + ": " + kUNetModule +
          ": LoRA down [32, 2] / up [32, 2] do not fit the layer's weight [32, 32] (expected down [32, 32], up [32, "
          "32])");
  EXPECT_EQ(sd::test::error_message([&] { load_lora_file(dir.path() / "missing.safetensors", pipe); }),
            (dir.path() / "missing.safetensors").string() + ": no such LoRA file");
  EXPECT_EQ(sd::test::error_message([&] {
              apply_lora_files(pipe, {"a", "b"}, {0.5}, false);
            }),
            "--lora_scale given 1 time(s) for 2 --lora file(s): give one scale per --lora, in the same order");
}

}  // namespace
}  // namespace sd::pipeline
