// UNet2DConditionModel's config.json: every key diffusers 0.24 writes, diffusers' defaults for keys a file omits,
// validation of what sdtrain's UNet implements (the SD-1.x / SD-2.x architecture), and the real SD configs.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/json_config.h"

namespace sd::models {

// A key diffusers accepts either as one int for every block or as a per-block list (attention_head_dim, ...).
// Remembers which form it had, so to_json writes it back the same way.
struct PerBlockInt {
  std::vector<int64_t> values;
  bool is_list = false;

  static PerBlockInt scalar(int64_t v) { return {{v}, false}; }
  static PerBlockInt list(std::vector<int64_t> v) { return {std::move(v), true}; }
  int64_t at(size_t block) const { return is_list ? values.at(block) : values.at(0); }
  // The value for each of n blocks (the scalar repeated).
  std::vector<int64_t> expand(size_t n) const;
  nlohmann::json to_json() const;
  bool operator==(const PerBlockInt& o) const { return values == o.values && is_list == o.is_list; }
};

struct UNetConfig {
  // Where the config came from ("…/unet/config.json" or "UNetConfig"), for error messages.
  std::string source = "UNetConfig";

  std::optional<int64_t> sample_size;
  int64_t in_channels = 4;
  int64_t out_channels = 4;
  bool center_input_sample = false;
  bool flip_sin_to_cos = true;
  int64_t freq_shift = 0;
  std::vector<std::string> down_block_types{"CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                                            "DownBlock2D"};
  std::optional<std::string> mid_block_type = "UNetMidBlock2DCrossAttn";
  std::vector<std::string> up_block_types{"UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                                          "CrossAttnUpBlock2D"};
  nlohmann::json only_cross_attention = false;  // bool or list of bools; sdtrain supports false only
  std::vector<int64_t> block_out_channels{320, 640, 1280, 1280};
  PerBlockInt layers_per_block = PerBlockInt::scalar(2);
  int64_t downsample_padding = 1;
  double mid_block_scale_factor = 1;
  double dropout = 0.0;
  std::string act_fn = "silu";
  std::optional<int64_t> norm_num_groups = 32;
  double norm_eps = 1e-5;
  PerBlockInt cross_attention_dim = PerBlockInt::scalar(1280);
  PerBlockInt transformer_layers_per_block = PerBlockInt::scalar(1);
  nlohmann::json reverse_transformer_layers_per_block = nullptr;  // SDXL-refiner style; null only
  std::optional<int64_t> encoder_hid_dim;
  std::optional<std::string> encoder_hid_dim_type;
  // Despite its name this is the NUMBER OF HEADS in every SD config (diffusers issue #2011); see heads().
  PerBlockInt attention_head_dim = PerBlockInt::scalar(8);
  std::optional<PerBlockInt> num_attention_heads;
  bool dual_cross_attention = false;
  bool use_linear_projection = false;
  std::optional<std::string> class_embed_type;
  std::optional<std::string> addition_embed_type;
  std::optional<int64_t> addition_time_embed_dim;
  std::optional<int64_t> num_class_embeds;
  bool upcast_attention = false;
  std::string resnet_time_scale_shift = "default";
  // The next two only affect ResnetDownsampleBlock2D/SimpleCrossAttn blocks in diffusers, which SD does not use.
  bool resnet_skip_time_act = false;
  double resnet_out_scale_factor = 1.0;
  std::string time_embedding_type = "positional";
  std::optional<int64_t> time_embedding_dim;
  std::optional<std::string> time_embedding_act_fn;
  std::optional<std::string> timestep_post_act;
  std::optional<int64_t> time_cond_proj_dim;
  int64_t conv_in_kernel = 3;
  int64_t conv_out_kernel = 3;
  std::optional<int64_t> projection_class_embeddings_input_dim;
  std::string attention_type = "default";
  bool class_embeddings_concat = false;
  std::optional<bool> mid_block_only_cross_attention;
  std::optional<std::string> cross_attention_norm;
  int64_t addition_embed_type_num_heads = 64;

  // Parses and validates; a wrong-typed or unsupported key throws sd::Error naming the file and key.
  static UNetConfig from_json(const io::JsonConfig& cfg);
  static UNetConfig load(const std::string& path);
  // Every key, as diffusers 0.24 writes config.json (sorted keys, _class_name, _diffusers_version).
  nlohmann::json to_json() const;

  // Throws sd::Error "<source>: key '<k>' ..." for values the UNet does not implement or that are inconsistent.
  void validate() const;

  size_t num_blocks() const { return block_out_channels.size(); }
  // Attention heads of down block i (diffusers: num_attention_heads or attention_head_dim).
  int64_t heads(size_t block) const {
    return (num_attention_heads ? *num_attention_heads : attention_head_dim).at(block);
  }
  int64_t time_embed_dim() const { return time_embedding_dim.value_or(block_out_channels.at(0) * 4); }

  // runwayml/stable-diffusion-v1-5, stabilityai/stable-diffusion-2-base (512², epsilon) and
  // stabilityai/stable-diffusion-2 (768², v-prediction) unet/config.json.
  static UNetConfig sd15();
  static UNetConfig sd2_base();
  static UNetConfig sd2();
};

}  // namespace sd::models
