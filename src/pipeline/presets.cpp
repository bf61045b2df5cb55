#include "pipeline/presets.h"

#include <ATen/Context.h>
#include <torch/nn/init.h>

#include "core/assets.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json_config.h"

namespace sd::pipeline {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

schedulers::SchedulerConfig sd_scheduler(const std::string& class_name, const std::string& prediction_type) {
  const json config = {{"_class_name", class_name},   {"_diffusers_version", "0.24.0"},
                       {"beta_end", 0.012},           {"beta_schedule", "scaled_linear"},
                       {"beta_start", 0.00085},       {"clip_sample", false},
                       {"num_train_timesteps", 1000}, {"prediction_type", prediction_type},
                       {"set_alpha_to_one", false},   {"skip_prk_steps", true},
                       {"steps_offset", 1},           {"timestep_spacing", "leading"},
                       {"trained_betas", nullptr}};
  return schedulers::SchedulerConfig::from_json(io::JsonConfig(config, class_name + " preset scheduler_config"));
}

// The tiny preset is tiny-sd1 of the reference fixtures: a 2.2M-parameter UNet at 16x16 latents, a 64x64 VAE
// and a 5-layer, 32-wide text encoder with the real vocabulary.
PipelineConfigs tiny_preset() {
  const json unet = {{"block_out_channels", {32, 64, 64}},
                     {"layers_per_block", 2},
                     {"down_block_types", {"CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"}},
                     {"up_block_types", {"UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"}},
                     {"cross_attention_dim", 32},
                     {"attention_head_dim", 8},
                     {"sample_size", 16}};
  const json vae = {{"block_out_channels", {32, 32, 64}},
                    {"down_block_types", {"DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"}},
                    {"up_block_types", {"UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"}},
                    {"layers_per_block", 2},
                    {"latent_channels", 4},
                    {"sample_size", 64}};
  const json text = {{"hidden_size", 32},      {"intermediate_size", 37}, {"num_attention_heads", 4},
                     {"num_hidden_layers", 5}, {"projection_dim", 32},    {"hidden_act", "quick_gelu"},
                     {"bos_token_id", 0},      {"eos_token_id", 2}};
  return {models::UNetConfig::from_json(io::JsonConfig(unet, "tiny preset unet")),
          models::VaeConfig::from_json(io::JsonConfig(vae, "tiny preset vae")),
          models::ClipTextConfig::from_json(io::JsonConfig(text, "tiny preset text_encoder")),
          sd_scheduler("PNDMScheduler", "epsilon"), false};
}

json special_token(const std::string& content) {
  return {{"content", content}, {"lstrip", false}, {"normalized", true}, {"rstrip", false}, {"single_word", false}};
}

}  // namespace

void write_preset_tokenizer(const fs::path& dir, bool sd2) {
  io::write_text_file(dir / "vocab.json", std::string(assets::clip_vocab_json()));
  io::write_text_file(dir / "merges.txt", std::string(assets::clip_merges_txt()));
  json added = {{"49406", special_token("<|startoftext|>")}, {"49407", special_token("<|endoftext|>")}};
  added["49406"]["special"] = true;
  added["49407"]["special"] = true;
  if (sd2)
    added["0"] = {{"content", "!"},  {"lstrip", false},      {"normalized", false},
                  {"rstrip", false}, {"single_word", false}, {"special", true}};
  const std::string pad = sd2 ? "!" : "<|endoftext|>";
  json config = {{"added_tokens_decoder", added},
                 {"bos_token", "<|startoftext|>"},
                 {"clean_up_tokenization_spaces", true},
                 {"eos_token", "<|endoftext|>"},
                 {"errors", "replace"},
                 {"model_max_length", 77},
                 {"pad_token", pad},
                 {"tokenizer_class", "CLIPTokenizer"},
                 {"unk_token", "<|endoftext|>"}};
  json special = {{"bos_token", special_token("<|startoftext|>")},
                  {"eos_token", special_token("<|endoftext|>")},
                  {"pad_token", pad},
                  {"unk_token", special_token("<|endoftext|>")}};
  io::write_text_file(dir / "tokenizer_config.json", config.dump(2) + "\n");
  io::write_text_file(dir / "special_tokens_map.json", special.dump(2) + "\n");
}

std::vector<std::string> preset_names() { return {"tiny", "sd15", "sd2-base", "sd2-768-v"}; }

PipelineConfigs preset_configs(const std::string& name) {
  if (name == "tiny") return tiny_preset();
  if (name == "sd15")
    return {models::UNetConfig::sd15(), models::VaeConfig::sd(), models::ClipTextConfig::sd15(),
            sd_scheduler("PNDMScheduler", "epsilon"), false};
  if (name == "sd2-base")
    return {models::UNetConfig::sd2_base(), models::VaeConfig::sd(), models::ClipTextConfig::sd2(),
            sd_scheduler("PNDMScheduler", "epsilon"), true};
  if (name == "sd2-768-v")
    return {models::UNetConfig::sd2(), models::VaeConfig::sd(), models::ClipTextConfig::sd2(),
            sd_scheduler("DDIMScheduler", "v_prediction"), true};
  fail("--preset: unknown preset '{}' (expected one of tiny, sd15, sd2-base, sd2-768-v)", name);
}

StableDiffusion make_preset(const std::string& name, uint64_t seed, const fs::path& work_dir) {
  PipelineConfigs preset = preset_configs(name);
  write_preset_tokenizer(work_dir / "tokenizer", preset.sd2_tokenizer);
  // One seed, then the components in diffusers' order of construction (UNet, VAE, text encoder).
  at::manual_seed(seed);
  StableDiffusion pipe{model_index_json(preset.scheduler.class_name),
                       text::ClipTokenizer::load(work_dir / "tokenizer"),
                       nullptr,
                       nullptr,
                       nullptr,
                       preset.scheduler};
  pipe.unet = models::UNet2DConditionModel(preset.unet);
  pipe.vae = models::AutoencoderKL(preset.vae);
  pipe.text_encoder = models::ClipTextModel(preset.text_encoder);
  // transformers initialises CLIP's embeddings with N(0, 0.02), not nn.Embedding's N(0, 1).
  torch::NoGradGuard no_grad;
  auto& embeddings = *pipe.text_encoder->text_model->embeddings;
  const double std = preset.text_encoder.initializer_range * preset.text_encoder.initializer_factor;
  torch::nn::init::normal_(embeddings.token_embedding->weight, 0.0, std);
  torch::nn::init::normal_(embeddings.position_embedding->weight, 0.0, std);
  return pipe;
}

void write_preset(const std::string& name, uint64_t seed, const fs::path& out, at::ScalarType dtype) {
  preset_configs(name);  // an unknown name fails before anything is written
  fs::path work = out;
  work += ".init-tmp";
  fs::remove_all(work);
  try {
    StableDiffusion pipe = make_preset(name, seed, work);
    save_pipeline(pipe, out, dtype);
    fs::remove_all(work);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(work, ignored);
    throw;
  }
}

}  // namespace sd::pipeline
