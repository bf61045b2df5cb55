// What a model named on the command line points to (--pretrained_model_name_or_path, generate --model, convert's
// input), decided in one place for every subcommand: a diffusers pipeline folder, a single-file checkpoint
// (.safetensors, .ckpt), or a Hugging Face Hub name ("runwayml/stable-diffusion-v1-5") found in the local cache.
#pragma once
#include <filesystem>
#include <string>

#include "pipeline/stable_diffusion.h"

namespace sd::pipeline {

struct ModelRequest {
  std::string name_or_path;
  std::string revision;     // Hub names: a branch, tag or commit hash ("" means main)
  std::string variant;      // e.g. "fp16": load the weights named *.fp16.*
  std::string config_from;  // single files: a diffusers pipeline folder whose configs to use ("" detects them)
};

struct ModelSource {
  enum class Kind { kPipelineFolder, kSingleFile };
  Kind kind = Kind::kPipelineFolder;
  std::filesystem::path path;  // the folder (a Hub snapshot for Hub names) or the file
  std::string variant;
  std::filesystem::path config_from;
};

// Local paths win over Hub names, as in diffusers (which ignores --revision for them too). Throws one sd::Error line
// for a name that is neither, a flag that does not apply (--config_from for a folder, --variant for a single file),
// or a Hub name that is not cached.
ModelSource resolve_model(const ModelRequest& request);

// The component configs (reading no weights), for checks that should fail before the weights load.
PipelineConfigs read_configs(const ModelSource& source);

// Loads the whole pipeline. `tokenizer_dir` overrides its tokenizer.
StableDiffusion load_pipeline(const ModelSource& source, const ComponentDtypes& dtypes = {},
                              const std::filesystem::path& tokenizer_dir = {});

// Writes the source's `component` folder ("unet", "vae", "scheduler", ...) into `dir` in full precision: a copy of
// a pipeline folder's files, or the component converted from a single file.
void write_component(const ModelSource& source, const std::string& component, const std::filesystem::path& dir);

}  // namespace sd::pipeline
