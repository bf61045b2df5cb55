// What a model named on the command line points to (--pretrained_model_name_or_path, generate/benchmark --model,
// inspect's and convert's input), decided in one place for every subcommand: a diffusers pipeline folder, a
// single-file checkpoint (.safetensors, .ckpt), or a Hugging Face Hub name ("runwayml/stable-diffusion-v1-5") found
// in the local cache. Everything a subcommand does with its model (configs, loading, copying unchanged components
// into an output pipeline, summarizing) goes through the resolved ModelSource.
#pragma once
#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "pipeline/stable_diffusion.h"

namespace sd::pipeline {

// The model flags as given.
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

// Loads the pipeline; components whose dtype is Undefined are left out. `tokenizer_dir` overrides its tokenizer.
StableDiffusion load_pipeline(const ModelSource& source, const ComponentDtypes& dtypes = {},
                              const std::filesystem::path& tokenizer_dir = {});

// Replaces the pipeline's VAE, in the dtype it was loaded in, with one given apart (generate's and convert's --vae;
// diffusers' from_pretrained(..., vae=AutoencoderKL.from_pretrained(...))): a diffusers VAE folder (config.json and
// diffusion_pytorch_model.*, e.g. stabilityai/sd-vae-ft-mse), a pipeline folder (its vae/), or one file
// (single_file_vae of single_file.h), which keeps the model's VAE config. Throws one sd::Error line naming the path
// for anything else, weights that do not fit, or a VAE whose latents the UNet cannot take.
void replace_vae(StableDiffusion& pipe, const std::filesystem::path& vae);

// For a pipeline written part by part (a trained component next to unchanged ones): writes the source's component
// folders `parts` ("unet", "vae", "text_encoder", "tokenizer", "scheduler") into the pipeline folder `to`, each
// atomically and in full precision: a pipeline folder's files copied as they are, a single file's components
// converted.
void copy_components(const ModelSource& source, const std::filesystem::path& to, const std::vector<std::string>& parts);

// What a model's weights hold, from the file headers alone (nothing is loaded).
struct ComponentSummary {
  std::string name;        // unet, vae, text_encoder
  std::string class_name;  // from model_index.json
  int64_t parameters = 0;  // floating-point elements (an integer position_ids buffer is not a parameter)
  std::set<std::string> dtypes;
  uint64_t bytes = 0;      // of the stored tensors
  bool trainable = false;  // what UNet training trains
};
std::vector<ComponentSummary> summarize_components(const ModelSource& source);
// Adds a floating-point tensor's elements, bytes and dtype name (float32, bfloat16, ...) to `summary`.
void count_tensor(const io::TensorInfo& info, ComponentSummary& summary);
// MosaicML's summary line: "Model has 1289.952427 M parameters and 865.910724 M trainable".
std::string parameter_line(const std::vector<ComponentSummary>& components);

}  // namespace sd::pipeline
