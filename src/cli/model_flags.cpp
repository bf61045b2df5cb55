#include "cli/model_flags.h"

#include <filesystem>

#include "cli/flags.h"
#include "core/error.h"

namespace sd::cli {

CLI::Option* add_model_flags(CLI::App* cmd, const std::string& name, pipeline::ModelRequest& request,
                             const std::string& group, const std::string& variant_flag) {
  const std::string help =
      "Diffusers pipeline folder, single-file checkpoint (.safetensors, .ckpt) or Hub name in the local Hugging Face "
      "cache";
  CLI::Option* model = name.rfind("--", 0) == 0 ? flag(cmd, name, request.name_or_path, help)
                                                : cmd->add_option(name, request.name_or_path, help);
  model->group(group);
  flag(cmd, "--revision", request.revision, "Hub name: branch, tag or commit hash in the local cache (default main)")
      ->group(group);
  flag(cmd, variant_flag, request.variant,
       "Load the weights of this variant where a component has them (e.g. fp16: *.fp16.safetensors)")
      ->group(group);
  flag(cmd, "--config_from", request.config_from,
       "Single-file checkpoint: a diffusers pipeline folder whose configs to use (default: the matching preset)")
      ->group(group);
  return model;
}

void add_lora_flags(CLI::App* cmd, LoraRequest& request, const std::string& use) {
  repeated_flag(
      cmd, "--lora", request.files,
      "A LoRA file (diffusers pytorch_lora_weights.safetensors or .bin, kohya/A1111 format, or LyCORIS "
      "LoCon/LoHa/LoKr/full/IA3/OFT/GLoRA/norm, with or without DoRA) or a folder holding pytorch_lora_weights.*, " +
          use + "; repeatable");
  repeated_flag(
      cmd, "--lora_scale", request.scales,
      "Strength of the --lora given in the same position (default 1; diffusers' cross_attention_kwargs scale)");
}

namespace {

void check_exists(const std::string& flag_name, const std::string& path) {
  SD_CHECK(std::filesystem::exists(path), "{} {}: no such file or folder", flag_name, path);
}

}  // namespace

void check_lora_files_exist(const LoraRequest& request) {
  for (const auto& path : request.files) check_exists("--lora", path);
}

void add_vae_flag(CLI::App* cmd, std::string& vae, const std::string& use) {
  flag(cmd, "--vae", vae,
       "A VAE to use instead of the model's: a diffusers VAE folder (config.json, diffusion_pytorch_model.*), a "
       "pipeline folder (its vae/), a VAE file in the original layout (e.g. vae-ft-mse-840000-ema-pruned"
       ".safetensors or .ckpt) or a single-file checkpoint (its VAE), " +
           use)
      ->group("Model");
}

void check_vae_exists(const std::string& vae) {
  if (!vae.empty()) check_exists("--vae", vae);
}

}  // namespace sd::cli
