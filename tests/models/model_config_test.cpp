#include <fstream>

#include "io/atomic_file.h"
#include "model_test_util.h"
#include "models/unet/unet_config.h"
#include "models/vae/vae_config.h"

namespace sd::models {
namespace {

using nlohmann::json;
using sd::test::error_message;
using sd::test::fixtures;
using sd::test::TempDir;

json read_json(const std::filesystem::path& path) { return json::parse(io::read_text_file(path)); }

// Writes `j` as <dir>/config.json and returns its path.
std::string write_config(const TempDir& dir, const json& j) {
  const auto path = dir.path() / "config.json";
  io::write_text_file(path, j.dump(2));
  return path.string();
}

TEST(UNetConfig, RoundTripsTheFixtureConfigsExactly) {
  for (const std::string pipeline : {"tiny-sd1", "tiny-sd2"}) {
    const auto path = fixtures() / pipeline / "unet" / "config.json";
    const json original = read_json(path);
    const json written = UNetConfig::load(path.string()).to_json();
    // Same keys, same values and the same spelling of numbers (1 vs 1.0).
    EXPECT_EQ(written.dump(2), original.dump(2)) << pipeline;
  }
}

TEST(UNetConfig, FixtureValuesAreParsed) {
  UNetConfig sd1 = UNetConfig::load((fixtures() / "tiny-sd1" / "unet" / "config.json").string());
  EXPECT_EQ(sd1.block_out_channels, (std::vector<int64_t>{32, 64, 64}));
  EXPECT_FALSE(sd1.attention_head_dim.is_list);
  EXPECT_EQ(sd1.heads(2), 8);
  EXPECT_EQ(sd1.cross_attention_dim.at(1), 32);
  EXPECT_EQ(sd1.layers_per_block.at(0), 2);
  EXPECT_FALSE(sd1.use_linear_projection);
  EXPECT_EQ(sd1.sample_size, 16);
  UNetConfig sd2 = UNetConfig::load((fixtures() / "tiny-sd2" / "unet" / "config.json").string());
  EXPECT_TRUE(sd2.attention_head_dim.is_list);
  EXPECT_EQ(sd2.heads(0), 2);
  EXPECT_EQ(sd2.heads(1), 4);
  EXPECT_TRUE(sd2.use_linear_projection);
  EXPECT_EQ(sd2.cross_attention_dim.at(0), 64);
}

TEST(UNetConfig, MissingKeysTakeDiffusersDefaults) {
  TempDir dir;
  UNetConfig c = UNetConfig::load(write_config(dir, json::object()));
  const json j = c.to_json();
  EXPECT_EQ(j["block_out_channels"], json({320, 640, 1280, 1280}));
  EXPECT_EQ(j["down_block_types"],
            json({"CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"}));
  EXPECT_EQ(j["up_block_types"], json({"UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"}));
  EXPECT_EQ(j["mid_block_type"], "UNetMidBlock2DCrossAttn");
  EXPECT_EQ(j["attention_head_dim"], 8);
  EXPECT_EQ(j["cross_attention_dim"], 1280);
  EXPECT_EQ(j["flip_sin_to_cos"], true);
  EXPECT_EQ(j["sample_size"], nullptr);
  EXPECT_EQ(j["norm_eps"], 1e-5);
  EXPECT_EQ(j["resnet_out_scale_factor"].dump(), "1.0");
  EXPECT_EQ(j["mid_block_scale_factor"].dump(), "1");
  EXPECT_EQ(j["addition_embed_type_num_heads"], 64);
  EXPECT_EQ(j.size(), 50u);  // 48 config keys + _class_name + _diffusers_version
  // A missing key and an explicit null differ for mid_block_type: null means no mid block.
  UNetConfig no_mid = UNetConfig::load(write_config(dir, json{{"mid_block_type", nullptr}}));
  EXPECT_FALSE(no_mid.mid_block_type.has_value());
}

TEST(UNetConfig, EveryFixtureKeyIsKnown) {
  // The default config writes exactly the keys diffusers 0.24 writes.
  const json fixture = read_json(fixtures() / "tiny-sd1" / "unet" / "config.json");
  const json ours = UNetConfig().to_json();
  for (const auto& [key, value] : fixture.items()) EXPECT_TRUE(ours.contains(key)) << key;
  for (const auto& [key, value] : ours.items()) EXPECT_TRUE(fixture.contains(key)) << key;
}

TEST(UNetConfig, WrongTypedKeyNamesFileAndKey) {
  const json base = read_json(fixtures() / "tiny-sd1" / "unet" / "config.json");
  const std::vector<std::pair<std::string, json>> cases = {
      {"layers_per_block", "two"}, {"use_linear_projection", 1}, {"attention_head_dim", json({8, "x"})},
      {"block_out_channels", 32},  {"norm_eps", "1e-5"},         {"only_cross_attention", "no"},
      {"sample_size", 1.5},        {"class_embed_type", 3},      {"cross_attention_dim", json::object()},
      {"sample_size", 0}};
  for (const auto& [key, value] : cases) {
    TempDir dir;
    json j = base;
    j[key] = value;
    const std::string path = write_config(dir, j);
    const std::string msg = error_message([&] { UNetConfig::load(path); });
    EXPECT_NE(msg.find(path), std::string::npos) << key << ": " << msg;
    EXPECT_NE(msg.find("'" + key + "'"), std::string::npos) << key << ": " << msg;
  }
}

TEST(UNetConfig, UnsupportedFeaturesNameTheKey) {
  const json base = read_json(fixtures() / "tiny-sd1" / "unet" / "config.json");
  const std::vector<std::pair<std::string, json>> cases = {
      {"class_embed_type", "timestep"},
      {"num_class_embeds", 10},
      {"addition_embed_type", "text_time"},
      {"encoder_hid_dim", 64},
      {"dual_cross_attention", true},
      {"only_cross_attention", true},
      {"resnet_time_scale_shift", "scale_shift"},
      {"time_embedding_type", "fourier"},
      {"timestep_post_act", "silu"},
      {"time_cond_proj_dim", 256},
      {"attention_type", "gated"},
      {"num_attention_heads", 8},
      {"dropout", 0.1},
      {"act_fn", "tanh"},
      {"mid_block_type", "UNetMidBlock2DSimpleCrossAttn"},
      {"down_block_types", json({"AttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"})},
      {"up_block_types", json({"UpBlock2D", "CrossAttnUpBlock2D"})},
      {"transformer_layers_per_block", json({json({1, 2}), json({1}), json({1})})},
      {"attention_head_dim", json({2, 4})},
      {"norm_num_groups", nullptr},
      {"attention_head_dim", 7}};  // does not divide 32 channels
  for (const auto& [key, value] : cases) {
    TempDir dir;
    json j = base;
    j[key] = value;
    const std::string path = write_config(dir, j);
    const std::string msg = error_message([&] { UNetConfig::load(path); });
    EXPECT_NE(msg.find(path), std::string::npos) << key << ": " << msg;
    EXPECT_NE(msg.find("'" + key + "'"), std::string::npos) << key << ": " << msg;
  }
  TempDir dir;
  json j = base;
  j["_class_name"] = "UNet2DModel";
  EXPECT_NE(error_message([&] { UNetConfig::load(write_config(dir, j)); }).find("_class_name"), std::string::npos);
}

TEST(UNetConfig, StableDiffusionConfigs) {
  const json sd15 = UNetConfig::sd15().to_json();
  EXPECT_EQ(sd15["attention_head_dim"], 8);
  EXPECT_EQ(sd15["cross_attention_dim"], 768);
  EXPECT_EQ(sd15["sample_size"], 64);
  EXPECT_EQ(sd15["use_linear_projection"], false);
  EXPECT_EQ(sd15["block_out_channels"], json({320, 640, 1280, 1280}));
  const json sd2 = UNetConfig::sd2().to_json();
  EXPECT_EQ(sd2["attention_head_dim"], json({5, 10, 20, 20}));
  EXPECT_EQ(sd2["cross_attention_dim"], 1024);
  EXPECT_EQ(sd2["use_linear_projection"], true);
  EXPECT_EQ(sd2["sample_size"], 96);
  EXPECT_EQ(UNetConfig::sd2_base().to_json()["sample_size"], 64);
  // Head dim = channels / heads: 40..160 for SD-1.5, 64 everywhere for SD-2.
  EXPECT_EQ(320 / UNetConfig::sd15().heads(0), 40);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(UNetConfig::sd2().block_out_channels[i] / UNetConfig::sd2().heads(i), 64);
  // And they survive a write/read cycle.
  TempDir dir;
  for (const auto& c : {UNetConfig::sd15(), UNetConfig::sd2()}) {
    const json j = c.to_json();
    EXPECT_EQ(UNetConfig::load(write_config(dir, j)).to_json(), j);
  }
}

TEST(VaeConfig, RoundTripsTheFixtureConfigsExactly) {
  for (const std::string pipeline : {"tiny-sd1", "tiny-sd2"}) {
    const auto path = fixtures() / pipeline / "vae" / "config.json";
    EXPECT_EQ(VaeConfig::load(path.string()).to_json().dump(2), read_json(path).dump(2)) << pipeline;
  }
}

TEST(VaeConfig, DefaultsWrongTypesAndUnsupportedBlocks) {
  TempDir dir;
  const json defaults = VaeConfig::load(write_config(dir, json::object())).to_json();
  EXPECT_EQ(defaults["block_out_channels"], json({64}));
  EXPECT_EQ(defaults["layers_per_block"], 1);
  EXPECT_EQ(defaults["scaling_factor"], 0.18215);
  EXPECT_EQ(defaults["sample_size"], 32);
  EXPECT_EQ(defaults["force_upcast"], true);
  const json fixture = read_json(fixtures() / "tiny-sd1" / "vae" / "config.json");
  EXPECT_EQ(defaults.size(), fixture.size());
  for (const auto& [key, value] : fixture.items()) EXPECT_TRUE(defaults.contains(key)) << key;

  const std::vector<std::pair<std::string, json>> cases = {
      {"latent_channels", 4.5},
      {"scaling_factor", "0.18"},
      {"force_upcast", "yes"},
      {"down_block_types", json({"DownEncoderBlock2D", "AttnDownEncoderBlock2D", "DownEncoderBlock2D"})},
      {"up_block_types", json({"UpDecoderBlock2D"})},
      {"norm_num_groups", 24},
      {"act_fn", "tanh"}};
  for (const auto& [key, value] : cases) {
    json j = fixture;
    j[key] = value;
    const std::string path = write_config(dir, j);
    const std::string msg = error_message([&] { VaeConfig::load(path); });
    EXPECT_NE(msg.find(path), std::string::npos) << key << ": " << msg;
    EXPECT_NE(msg.find("'" + key + "'"), std::string::npos) << key << ": " << msg;
  }
  const json sd = VaeConfig::sd().to_json();
  EXPECT_EQ(sd["block_out_channels"], json({128, 256, 512, 512}));
  EXPECT_EQ(sd["layers_per_block"], 2);
  EXPECT_EQ(sd["sample_size"], 512);
}

}  // namespace
}  // namespace sd::models
