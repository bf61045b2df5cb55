// AutoencoderKL's config.json: every key diffusers 0.24 writes, its defaults, validation, and SD's VAE config.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "io/json_config.h"

namespace sd::models {

struct VaeConfig {
  std::string source = "VaeConfig";  // for error messages

  int64_t in_channels = 3;
  int64_t out_channels = 3;
  std::vector<std::string> down_block_types{"DownEncoderBlock2D"};
  std::vector<std::string> up_block_types{"UpDecoderBlock2D"};
  std::vector<int64_t> block_out_channels{64};
  int64_t layers_per_block = 1;
  std::string act_fn = "silu";
  int64_t latent_channels = 4;
  int64_t norm_num_groups = 32;
  int64_t sample_size = 32;
  double scaling_factor = 0.18215;
  bool force_upcast = true;

  static VaeConfig from_json(const io::JsonConfig& cfg);
  static VaeConfig load(const std::string& path);
  nlohmann::json to_json() const;
  void validate() const;
  // Pixels per latent along each side: every block but the last halves the image.
  int64_t scale_factor() const { return int64_t{1} << (block_out_channels.size() - 1); }

  // The SD-1.x / SD-2.x VAE (runwayml/stable-diffusion-v1-5 vae/config.json; SD-2 differs only in sample_size 768).
  static VaeConfig sd();
};

}  // namespace sd::models
