// The flags that name a model, alike in every subcommand: the model itself (a diffusers pipeline folder, a
// single-file checkpoint or a Hub name in the local Hugging Face cache) and its companions --revision, --variant and
// --config_from, read into a pipeline::ModelRequest for pipeline::resolve_model; the LoRA files applied to it; and a
// VAE to use in place of its own.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "pipeline/model_source.h"

namespace sd::cli {

// Registers the model as `name` (a flag such as "--model", or a positional argument such as "input") and its
// companions, all in `group`; returns the model's option (to mark it required). `variant_flag` renames --variant
// where that name means something else (convert's output variant).
CLI::Option* add_model_flags(CLI::App* cmd, const std::string& name, pipeline::ModelRequest& request,
                             const std::string& group = "Model", const std::string& variant_flag = "--variant");

// --lora FILE (repeatable) and --lora_scale S (one per --lora, in order): LoRA files to apply to the model.
struct LoraRequest {
  std::vector<std::string> files;
  std::vector<double> scales;
};

// Registers --lora and --lora_scale; `use` ends --lora's help (what the files are applied for).
void add_lora_flags(CLI::App* cmd, LoraRequest& request, const std::string& use);

// Throws sd::Error "--lora X: no such file or folder" for the first file that does not exist: before any model loads.
void check_lora_files_exist(const LoraRequest& request);

// --vae PATH: a VAE to use instead of the model's (pipeline::replace_vae); `use` ends its help.
void add_vae_flag(CLI::App* cmd, std::string& vae, const std::string& use);

// Throws sd::Error "--vae X: no such file or folder" unless `vae` is empty or exists: before any model loads.
void check_vae_exists(const std::string& vae);

}  // namespace sd::cli
