#include "models/clip/clip_config.h"

#include <set>

#include "core/error.h"

namespace sd::models {

namespace {

const std::set<std::string> kActivations = {"quick_gelu", "gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu"};

// Keys the struct holds, plus the ones transformers regenerates on save (never copied into `extra`).
const std::set<std::string> kKnownKeys = {"vocab_size",
                                          "hidden_size",
                                          "intermediate_size",
                                          "projection_dim",
                                          "num_hidden_layers",
                                          "num_attention_heads",
                                          "max_position_embeddings",
                                          "hidden_act",
                                          "layer_norm_eps",
                                          "attention_dropout",
                                          "initializer_range",
                                          "initializer_factor",
                                          "pad_token_id",
                                          "bos_token_id",
                                          "eos_token_id",
                                          "architectures",
                                          "torch_dtype",
                                          "transformers_version",
                                          "model_type",
                                          "_name_or_path",
                                          "_commit_hash"};

}  // namespace

ClipTextConfig ClipTextConfig::from_json(const io::JsonConfig& file_cfg) {
  // transformers' CLIPTextConfig.from_pretrained reads a CLIPConfig's text_config the same way.
  io::JsonConfig cfg = file_cfg;
  if (file_cfg.get<std::string>("model_type", "") == "clip") {
    SD_CHECK(file_cfg.raw().contains("text_config") && file_cfg.raw()["text_config"].is_object(),
             "{}: a 'clip' config needs an object 'text_config'", file_cfg.source());
    cfg = io::JsonConfig(file_cfg.raw()["text_config"], file_cfg.source() + " (text_config)");
  }
  ClipTextConfig c;
  c.vocab_size = cfg.get<int64_t>("vocab_size", c.vocab_size);
  c.hidden_size = cfg.get<int64_t>("hidden_size", c.hidden_size);
  c.intermediate_size = cfg.get<int64_t>("intermediate_size", c.intermediate_size);
  c.projection_dim = cfg.get<int64_t>("projection_dim", c.projection_dim);
  c.num_hidden_layers = cfg.get<int64_t>("num_hidden_layers", c.num_hidden_layers);
  c.num_attention_heads = cfg.get<int64_t>("num_attention_heads", c.num_attention_heads);
  c.max_position_embeddings = cfg.get<int64_t>("max_position_embeddings", c.max_position_embeddings);
  c.hidden_act = cfg.get<std::string>("hidden_act", c.hidden_act);
  c.layer_norm_eps = cfg.get<double>("layer_norm_eps", c.layer_norm_eps);
  c.attention_dropout = cfg.get<double>("attention_dropout", c.attention_dropout);
  c.initializer_range = cfg.get<double>("initializer_range", c.initializer_range);
  c.initializer_factor = cfg.get<double>("initializer_factor", c.initializer_factor);
  c.pad_token_id = cfg.get<int64_t>("pad_token_id", c.pad_token_id);
  c.bos_token_id = cfg.get<int64_t>("bos_token_id", c.bos_token_id);
  c.eos_token_id = cfg.get<int64_t>("eos_token_id", c.eos_token_id);
  c.architectures = cfg.get<std::vector<std::string>>("architectures", c.architectures);
  c.torch_dtype = cfg.get<std::string>("torch_dtype", c.torch_dtype);
  c.transformers_version = cfg.get<std::string>("transformers_version", c.transformers_version);
  const std::string model_type = cfg.get<std::string>("model_type", "clip_text_model");
  if (model_type != "clip_text_model") cfg.fail_key("model_type", "\"clip_text_model\"");
  for (const auto& [key, value] : cfg.raw().items())
    if (!kKnownKeys.count(key)) c.extra[key] = value;

  for (const auto& [key, value] : {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size},
                                   {"hidden_size", c.hidden_size},
                                   {"intermediate_size", c.intermediate_size},
                                   {"num_hidden_layers", c.num_hidden_layers},
                                   {"num_attention_heads", c.num_attention_heads},
                                   {"max_position_embeddings", c.max_position_embeddings}})
    if (value <= 0) cfg.fail_key(key, "a positive integer");
  // A few times the largest text towers of the SD family (OpenCLIP bigG: width 1280, 32 layers, 20 heads, 77
  // positions, 49408 tokens), before any weight is allocated.
  for (const auto& [key, value, limit] :
       {std::tuple{"vocab_size", c.vocab_size, int64_t{1} << 20},
        std::tuple{"hidden_size", c.hidden_size, int64_t{8192}},
        std::tuple{"intermediate_size", c.intermediate_size, int64_t{32768}},
        std::tuple{"num_hidden_layers", c.num_hidden_layers, int64_t{128}},
        std::tuple{"num_attention_heads", c.num_attention_heads, int64_t{256}},
        std::tuple{"max_position_embeddings", c.max_position_embeddings, int64_t{4096}},
        std::tuple{"projection_dim", c.projection_dim, int64_t{8192}}})
    io::check_at_most(cfg.source(), key, value, limit);
  if (c.hidden_size % c.num_attention_heads != 0)
    cfg.fail_key("num_attention_heads", fmt::format("a divisor of hidden_size {}", c.hidden_size));
  if (!kActivations.count(c.hidden_act))
    cfg.fail_key("hidden_act", "one of quick_gelu, gelu, gelu_new, gelu_pytorch_tanh, relu, silu");
  if (!(c.layer_norm_eps > 0)) cfg.fail_key("layer_norm_eps", "a positive number");
  if (!(c.attention_dropout >= 0 && c.attention_dropout < 1)) cfg.fail_key("attention_dropout", "a number in [0, 1)");
  return c;
}

ClipTextConfig ClipTextConfig::load(const std::filesystem::path& config_json) {
  return from_json(io::JsonConfig::load(config_json));
}

nlohmann::json ClipTextConfig::to_json() const {
  nlohmann::json j = extra;
  j["architectures"] = architectures;
  j["attention_dropout"] = attention_dropout;
  j["bos_token_id"] = bos_token_id;
  j["eos_token_id"] = eos_token_id;
  j["hidden_act"] = hidden_act;
  j["hidden_size"] = hidden_size;
  j["initializer_factor"] = initializer_factor;
  j["initializer_range"] = initializer_range;
  j["intermediate_size"] = intermediate_size;
  j["layer_norm_eps"] = layer_norm_eps;
  j["max_position_embeddings"] = max_position_embeddings;
  j["model_type"] = "clip_text_model";
  j["num_attention_heads"] = num_attention_heads;
  j["num_hidden_layers"] = num_hidden_layers;
  j["pad_token_id"] = pad_token_id;
  j["projection_dim"] = projection_dim;
  j["torch_dtype"] = torch_dtype;
  j["transformers_version"] = transformers_version;
  j["vocab_size"] = vocab_size;
  return j;
}

int64_t ClipTextConfig::parameter_count() const {
  const int64_t h = hidden_size, i = intermediate_size;
  const int64_t embeddings = vocab_size * h + max_position_embeddings * h;
  const int64_t attention = 4 * (h * h + h);  // q, k, v, out projections with bias
  const int64_t mlp = (h * i + i) + (i * h + h);
  const int64_t norms = 2 * 2 * h;
  return embeddings + num_hidden_layers * (attention + mlp + norms) + 2 * h /*final_layer_norm*/;
}

ClipTextConfig ClipTextConfig::sd15() {
  // openai/clip-vit-large-patch14's text tower, as shipped in runwayml/stable-diffusion-v1-5/text_encoder.
  ClipTextConfig c;
  c.hidden_size = 768;
  c.intermediate_size = 3072;
  c.projection_dim = 768;
  c.num_hidden_layers = 12;
  c.num_attention_heads = 12;
  c.hidden_act = "quick_gelu";
  c.bos_token_id = 0;
  c.eos_token_id = 2;
  c.extra = {{"dropout", 0.0}};
  return c;
}

ClipTextConfig ClipTextConfig::sd2() {
  // OpenCLIP ViT-H/14's text tower without its last layer (stabilityai/stable-diffusion-2/text_encoder).
  ClipTextConfig c;
  c.hidden_size = 1024;
  c.intermediate_size = 4096;
  c.projection_dim = 512;
  c.num_hidden_layers = 23;
  c.num_attention_heads = 16;
  c.hidden_act = "gelu";
  c.bos_token_id = 0;
  c.eos_token_id = 2;
  c.extra = {{"dropout", 0.0}};
  return c;
}

}  // namespace sd::models
