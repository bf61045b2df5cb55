// A whole Stable Diffusion pipeline in the diffusers layout: model_index.json, tokenizer/, text_encoder/, vae/,
// unet/, scheduler/. Loading checks the layout first so a wrong folder fails with one line naming what is missing.
#pragma once
#include <ATen/ATen.h>

#include <filesystem>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "models/clip/clip_text_model.h"
#include "models/unet/unet_2d_condition.h"
#include "models/vae/autoencoder_kl.h"
#include "schedulers/scheduler_config.h"
#include "text/clip_tokenizer.h"

namespace sd::pipeline {

// The dtype each model component is loaded in; at::ScalarType::Undefined leaves that component out (null), for a task
// that never runs it.
struct ComponentDtypes {
  at::ScalarType text_encoder = at::kFloat;
  at::ScalarType vae = at::kFloat;
  at::ScalarType unet = at::kFloat;
};

struct StableDiffusion {
  nlohmann::json model_index;
  text::ClipTokenizer tokenizer;
  models::ClipTextModel text_encoder{nullptr};
  models::AutoencoderKL vae{nullptr};
  models::UNet2DConditionModel unet{nullptr};
  schedulers::SchedulerConfig scheduler_config;

  // 2^(number of VAE blocks - 1): image pixels per latent pixel (8 for SD).
  int64_t vae_scale_factor() const;
};

// The configs of a pipeline's components: what a preset is made of, and what a single-file checkpoint lacks.
struct PipelineConfigs {
  models::UNetConfig unet;
  models::VaeConfig vae;
  models::ClipTextConfig text_encoder;
  schedulers::SchedulerConfig scheduler;
  bool sd2_tokenizer = false;  // presets: SD-2 pads with "!" (id 0), SD-1 with <|endoftext|>
};

// Throws sd::Error unless `dir` holds model_index.json and the component folders a StableDiffusionPipeline needs.
void check_pipeline_layout(const std::filesystem::path& dir);

// The component configs of a pipeline folder (no weights are read).
PipelineConfigs read_pipeline_configs(const std::filesystem::path& dir);

// Loads the components of a pipeline folder (the models whose dtype is not Undefined). `tokenizer_dir` overrides
// <dir>/tokenizer (textual inversion's --tokenizer_name). With a `variant` (e.g. "fp16") each component loads that
// variant's weights where its folder has them, as diffusers does; a variant no component has is an error.
StableDiffusion load_pipeline(const std::filesystem::path& dir, const ComponentDtypes& dtypes = {},
                              const std::filesystem::path& tokenizer_dir = {}, const std::string& variant = "");

// Throws sd::Error (naming `source`) unless the UNet's cross-attention width is the text encoder's hidden size (when
// both are loaded).
void check_components_fit(const StableDiffusion& pipe, const std::string& source);

// The component folders of a pipeline, in the order save_pipeline writes them.
inline constexpr const char* kComponentFolders[] = {"tokenizer", "text_encoder", "vae", "unet", "scheduler"};
bool is_component_folder(const std::string& name);

// For commands that write a new pipeline (init, convert): throws sd::Error naming `flag` if `dir` already holds one
// (model_index.json or a component folder) and `overwrite` is false, since save_pipeline would replace its weights
// with no way back.
void check_not_replacing_pipeline(const std::string& flag, const std::filesystem::path& dir, bool overwrite);

// Writes the pipeline as diffusers' save_pretrained does (weights in `dtype`, file names carrying `variant` if
// given), building it in a temporary folder and renaming it into place; an existing pipeline in `dir` is replaced,
// other files there are kept.
void save_pipeline(StableDiffusion& pipe, const std::filesystem::path& dir, at::ScalarType dtype = at::kFloat,
                   const std::string& variant = "");

// Writes one component folder ("tokenizer", "text_encoder", "vae", "unet" or "scheduler") as save_pipeline does.
void save_component(StableDiffusion& pipe, const std::string& component, const std::filesystem::path& dir,
                    at::ScalarType dtype = at::kFloat, const std::string& variant = "");

// model_index.json of a StableDiffusionPipeline whose scheduler is `scheduler_class`.
nlohmann::json model_index_json(const std::string& scheduler_class);

// Writes <dir>/model_index.json for `scheduler_class` (the pipeline's scheduler), last, marking the pipeline whole.
void write_model_index(const std::filesystem::path& dir, const std::string& scheduler_class);

}  // namespace sd::pipeline
