#include "pipeline/stable_diffusion.h"

#include <algorithm>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json_config.h"
#include "models/weights.h"

namespace sd::pipeline {

namespace fs = std::filesystem;

int64_t StableDiffusion::vae_scale_factor() const { return vae->config().scale_factor(); }

void check_pipeline_layout(const fs::path& dir) {
  SD_CHECK(fs::is_directory(dir), "{}: model folder not found (expected a diffusers pipeline folder)", dir.string());
  SD_CHECK(fs::is_regular_file(dir / "model_index.json"), "{}: not a diffusers pipeline (missing model_index.json)",
           dir.string());
  for (const char* part : {"unet", "vae", "text_encoder", "tokenizer", "scheduler"})
    SD_CHECK(fs::is_directory(dir / part), "{}: missing the {}/ folder of the pipeline", dir.string(), part);
}

PipelineConfigs read_pipeline_configs(const fs::path& dir) {
  check_pipeline_layout(dir);
  return {models::UNetConfig::load((dir / "unet" / "config.json").string()),
          models::VaeConfig::load((dir / "vae" / "config.json").string()),
          models::ClipTextConfig::load(dir / "text_encoder" / "config.json"),
          schedulers::SchedulerConfig::load(dir / "scheduler" / "scheduler_config.json")};
}

namespace {

constexpr const char* kWeightedComponents[] = {"text_encoder", "vae", "unet"};

void check_variant_exists(const fs::path& dir, const std::string& variant) {
  if (variant.empty()) return;
  for (const char* part : kWeightedComponents)
    if (models::has_variant_files(dir / part, variant)) return;
  fail("{}: no component has weights of variant '{}' (files named like diffusion_pytorch_model.{}.safetensors)",
       dir.string(), variant, variant);
}

}  // namespace

StableDiffusion load_pipeline(const fs::path& dir, const ComponentDtypes& dtypes, const fs::path& tokenizer_dir,
                              const std::string& variant) {
  check_pipeline_layout(dir);
  check_variant_exists(dir, variant);
  StableDiffusion pipe{io::JsonConfig::load(dir / "model_index.json").raw(),
                       text::ClipTokenizer::load(tokenizer_dir.empty() ? dir / "tokenizer" : tokenizer_dir),
                       nullptr,
                       nullptr,
                       nullptr,
                       schedulers::SchedulerConfig::load(dir / "scheduler" / "scheduler_config.json")};
  if (dtypes.text_encoder != at::ScalarType::Undefined)
    pipe.text_encoder = models::load_text_encoder(dir / "text_encoder", dtypes.text_encoder, variant);
  if (dtypes.vae != at::ScalarType::Undefined) pipe.vae = models::load_vae(dir / "vae", dtypes.vae, variant);
  if (dtypes.unet != at::ScalarType::Undefined) pipe.unet = models::load_unet(dir / "unet", dtypes.unet, variant);
  check_components_fit(pipe, dir.string());
  return pipe;
}

void check_components_fit(const StableDiffusion& pipe, const std::string& source) {
  if (!pipe.text_encoder) return;
  // Token ids index the embedding and prompts fill the positions: a mismatch would fail inside LibTorch.
  const models::ClipTextConfig& text = pipe.text_encoder->config();
  SD_CHECK(pipe.tokenizer.max_token_id() < text.vocab_size,
           "{}: the tokenizer has token ids up to {} but the text encoder embeds {} (its vocab_size)", source,
           pipe.tokenizer.max_token_id(), text.vocab_size);
  SD_CHECK(pipe.tokenizer.model_max_length() <= text.max_position_embeddings,
           "{}: the tokenizer pads prompts to {} tokens (model_max_length) but the text encoder has {} positions "
           "(max_position_embeddings)",
           source, pipe.tokenizer.model_max_length(), text.max_position_embeddings);
  if (!pipe.unet) return;
  const int64_t width = text.hidden_size;
  for (int64_t dim : pipe.unet->config().cross_attention_dim.values)
    SD_CHECK(dim == width, "{}: the UNet's cross_attention_dim ({}) differs from the text encoder's hidden_size ({})",
             source, dim, width);
}

nlohmann::json model_index_json(const std::string& scheduler_class) {
  return {{"_class_name", "StableDiffusionPipeline"},
          {"_diffusers_version", "0.24.0"},
          {"feature_extractor", {nullptr, nullptr}},
          {"image_encoder", {nullptr, nullptr}},
          {"requires_safety_checker", false},
          {"safety_checker", {nullptr, nullptr}},
          {"scheduler", {"diffusers", scheduler_class}},
          {"text_encoder", {"transformers", "CLIPTextModel"}},
          {"tokenizer", {"transformers", "CLIPTokenizer"}},
          {"unet", {"diffusers", "UNet2DConditionModel"}},
          {"vae", {"diffusers", "AutoencoderKL"}}};
}

void write_model_index(const fs::path& dir, const std::string& scheduler_class) {
  io::write_text_file(dir / "model_index.json", model_index_json(scheduler_class).dump(2) + "\n");
}

namespace {

std::string scheduler_class_of(const StableDiffusion& pipe) {
  return pipe.model_index.contains("scheduler") ? pipe.model_index["scheduler"][1].get<std::string>() : "PNDMScheduler";
}

// What in `dir` shows that a pipeline is there ("" if nothing does).
std::string pipeline_marker(const fs::path& dir) {
  std::error_code ignored;
  if (fs::exists(dir / "model_index.json", ignored)) return "model_index.json";
  for (const char* part : kComponentFolders)
    if (fs::is_directory(dir / part, ignored)) return std::string(part) + "/";
  return "";
}

}  // namespace

void save_component(StableDiffusion& pipe, const std::string& component, const fs::path& dir, at::ScalarType dtype,
                    const std::string& variant) {
  const std::string weights = models::with_variant(models::WeightFileNames::diffusers().safetensors, variant);
  if (component == "tokenizer") {
    pipe.tokenizer.save(dir);
  } else if (component == "text_encoder") {
    models::save_text_encoder(pipe.text_encoder, dir, dtype, variant);
  } else if (component == "vae") {
    io::write_text_file(dir / "config.json", pipe.vae->config().to_json().dump(2) + "\n");
    models::save_weights(*pipe.vae, dir / weights, dtype);
  } else if (component == "unet") {
    io::write_text_file(dir / "config.json", pipe.unet->config().to_json().dump(2) + "\n");
    models::save_weights(*pipe.unet, dir / weights, dtype);
  } else if (component == "scheduler") {
    io::write_text_file(dir / "scheduler_config.json",
                        pipe.scheduler_config.to_json(scheduler_class_of(pipe)).dump(2) + "\n");
  } else {
    fail("save_component: unknown component '{}'", component);
  }
}

bool is_component_folder(const std::string& name) {
  return std::count(std::begin(kComponentFolders), std::end(kComponentFolders), name) > 0;
}

void check_not_replacing_pipeline(const std::string& flag, const fs::path& dir, bool overwrite) {
  const std::string marker = overwrite ? "" : pipeline_marker(dir);
  SD_CHECK(marker.empty(), "{} {}: already holds a pipeline ({}); pass --overwrite to replace it", flag, dir.string(),
           marker);
}

void save_pipeline(StableDiffusion& pipe, const fs::path& dir, at::ScalarType dtype, const std::string& variant) {
  fs::create_directories(dir);
  io::recover_interrupted_writes(dir, is_component_folder);
  // Every component goes to a temporary folder first, so a failure (a full disk) leaves the folder as it was; then
  // each replaces its old version (io::replace_directory: a kill leaves a whole version of each). model_index.json,
  // written last, marks the pipeline complete.
  fs::path tmp = dir / fmt::format(".partial-{}", getpid());
  fs::remove_all(tmp);
  try {
    for (const char* part : kComponentFolders) save_component(pipe, part, tmp / part, dtype, variant);
    fs::remove(dir / "model_index.json");
    for (const char* part : kComponentFolders) io::replace_directory(tmp / part, dir / part);
    fs::remove_all(tmp);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }
  write_model_index(dir, scheduler_class_of(pipe));
}

}  // namespace sd::pipeline
