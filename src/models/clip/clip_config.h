// CLIPTextConfig: the text encoder's config.json, with every key transformers 4.35 writes and its defaults.
#pragma once
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/json_config.h"

namespace sd::models {

struct ClipTextConfig {
  int64_t vocab_size = 49408;
  int64_t hidden_size = 512;
  int64_t intermediate_size = 2048;
  int64_t projection_dim = 512;  // unused by CLIPTextModel, kept for the file
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 8;
  int64_t max_position_embeddings = 77;
  std::string hidden_act = "quick_gelu";  // quick_gelu | gelu | gelu_new | gelu_pytorch_tanh | relu | silu
  double layer_norm_eps = 1e-5;
  double attention_dropout = 0.0;
  double initializer_range = 0.02;
  double initializer_factor = 1.0;
  int64_t pad_token_id = 1;
  int64_t bos_token_id = 49406;
  // 2 (legacy configs, incl. SD-1.5 and SD-2): the pooled output is taken at argmax(input_ids); otherwise at
  // the first position holding this id.
  int64_t eos_token_id = 49407;
  std::vector<std::string> architectures = {"CLIPTextModel"};
  std::string torch_dtype = "float32";
  std::string transformers_version = "4.35.0";
  // Keys this struct does not know (e.g. "dropout" in older files), written back unchanged.
  nlohmann::json extra = nlohmann::json::object();

  // A full CLIPConfig ("model_type": "clip") is accepted too: its "text_config" is used.
  static ClipTextConfig from_json(const io::JsonConfig& cfg);
  static ClipTextConfig load(const std::filesystem::path& config_json);
  nlohmann::json to_json() const;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // Parameters of CLIPTextModel for this config, computed from the shapes (no allocation).
  int64_t parameter_count() const;

  // The text encoders of the released checkpoints (runwayml/stable-diffusion-v1-5, stabilityai/stable-diffusion-2).
  static ClipTextConfig sd15();
  static ClipTextConfig sd2();
};

}  // namespace sd::models
