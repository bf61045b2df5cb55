// Stable Diffusion as one file in the original layout (CompVis/Stability SD-1.x/2.x checkpoints, A1111's
// models/Stable-diffusion): loaded as a diffusers pipeline through the key mapping of models/name_conversion.h,
// and written back from one. A single file holds weights only; the configs come from a pipeline folder
// (`config_from`) or, when none is given, from the sdtrain preset whose architecture the weights match.
#pragma once
#include <ATen/ATen.h>

#include <filesystem>

#include "io/tensor_file.h"
#include "pipeline/presets.h"
#include "pipeline/stable_diffusion.h"

namespace sd::pipeline {

// True when the file looks like a single-file checkpoint (its keys use the LDM prefixes).
bool is_single_file_checkpoint(const io::TensorFile& file);

// The configs for a single file: those of the pipeline folder `config_from`, or the matching preset's.
PipelineConfigs single_file_configs(const io::TensorFile& file, const std::filesystem::path& config_from);

// `file` (.safetensors, .ckpt/.pt/.bin zip-pickles) as a pipeline. `tokenizer_dir` overrides the tokenizer.
StableDiffusion load_single_file(const std::filesystem::path& file, const std::filesystem::path& config_from,
                                 const ComponentDtypes& dtypes = {}, const std::filesystem::path& tokenizer_dir = {});

// Writes the UNet, VAE and text encoder as one safetensors file in the LDM layout (what diffusers'
// convert_diffusers_to_original_stable_diffusion.py writes, with the VAE attention as original checkpoints hold it),
// floating-point tensors as `dtype`.
void save_single_file(StableDiffusion& pipe, const std::filesystem::path& file, at::ScalarType dtype = at::kFloat);

}  // namespace sd::pipeline
