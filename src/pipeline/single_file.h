// Stable Diffusion as one file in the original layout (CompVis/Stability SD-1.x/2.x checkpoints, A1111's
// models/Stable-diffusion): loaded as a diffusers pipeline through the key mapping of models/name_conversion.h,
// and written back from one. A single file holds weights only; the configs come from a pipeline folder
// (`config_from`) or, when none is given, from the sdtrain preset whose architecture the weights match.
#pragma once
#include <ATen/ATen.h>

#include <filesystem>
#include <memory>

#include "io/tensor_file.h"
#include "models/name_conversion.h"
#include "pipeline/stable_diffusion.h"

namespace sd::pipeline {

// An opened single-file checkpoint and the configs that describe it (only headers are read).
class SingleFileCheckpoint {
 public:
  // Throws one sd::Error line naming the file unless it is a single-file Stable Diffusion checkpoint whose
  // architecture the configs (of `config_from`, or the detected preset) describe.
  SingleFileCheckpoint(const std::filesystem::path& file, const std::filesystem::path& config_from);

  const PipelineConfigs& configs() const { return configs_; }
  // One component's tensors under their diffusers names, read on demand; usable after this object is gone.
  std::unique_ptr<io::TensorFile> component(models::Component component) const;
  // The pipeline, without the model components whose dtype is Undefined. `tokenizer_dir` overrides the tokenizer.
  StableDiffusion load(const ComponentDtypes& dtypes = {}, const std::filesystem::path& tokenizer_dir = {}) const;

 private:
  std::filesystem::path file_, config_from_;
  std::shared_ptr<const io::TensorFile> checkpoint_;
  PipelineConfigs configs_;
  models::LdmNames names_;
};

// SingleFileCheckpoint(file, config_from).load(dtypes, tokenizer_dir).
StableDiffusion load_single_file(const std::filesystem::path& file, const std::filesystem::path& config_from,
                                 const ComponentDtypes& dtypes = {}, const std::filesystem::path& tokenizer_dir = {});

// The VAE weights in one file under their diffusers names: a checkpoint's first_stage_model.* part, or a VAE saved
// alone in the original layout (encoder.down.*, decoder.up.*, quant_conv.*, as vae-ft-mse-840000-ema-pruned
// .safetensors / .ckpt hold it) or in diffusers' (encoder.down_blocks.*). Throws one sd::Error line naming the file
// when it is none of these.
std::unique_ptr<io::TensorFile> single_file_vae(const std::filesystem::path& file, const models::LdmNames& names);

// Writes the UNet, VAE and text encoder as one safetensors file in the LDM layout (what diffusers'
// convert_diffusers_to_original_stable_diffusion.py writes, with the VAE attention as original checkpoints hold it),
// floating-point tensors as `dtype`.
void save_single_file(StableDiffusion& pipe, const std::filesystem::path& file, at::ScalarType dtype = at::kFloat);

}  // namespace sd::pipeline
