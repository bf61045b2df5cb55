#include "pipeline/model_source.h"

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/hub_cache.h"
#include "io/json_config.h"
#include "models/weights.h"
#include "pipeline/single_file.h"

namespace sd::pipeline {

namespace fs = std::filesystem;
using models::Component;

namespace {

ModelSource resolve_path(const ModelRequest& request, const fs::path& path) {
  if (fs::is_directory(path)) {
    SD_CHECK(request.config_from.empty(), "--config_from applies to single-file checkpoints; {} is a folder",
             path.string());
    return {ModelSource::Kind::kPipelineFolder, path, request.variant, {}};
  }
  SD_CHECK(request.variant.empty(), "--variant applies to pipeline folders; {} is a single file", path.string());
  return {ModelSource::Kind::kSingleFile, path, "", request.config_from};
}

bool is_single_file(const ModelSource& source) { return source.kind == ModelSource::Kind::kSingleFile; }

models::WeightFileNames weight_file_names(Component component) {
  return component == Component::kTextEncoder ? models::WeightFileNames::transformers()
                                              : models::WeightFileNames::diffusers();
}

const char* dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kDouble: return "float64";
    default: return "float32";
  }
}

// The floating-point tensors of one component's weights.
void add_tensors(const io::TensorFile& weights, ComponentSummary& summary) {
  for (const auto& name : weights.names()) count_tensor(weights.info(name), summary);
}

}  // namespace

void count_tensor(const io::TensorInfo& info, ComponentSummary& summary) {
  if (!at::isFloatingType(info.dtype)) return;
  int64_t n = 1;
  for (int64_t d : info.shape) n *= d;
  summary.parameters += n;
  summary.bytes += static_cast<uint64_t>(n) * c10::elementSize(info.dtype);
  summary.dtypes.insert(dtype_name(info.dtype));
}

ModelSource resolve_model(const ModelRequest& request) {
  const std::string& name = request.name_or_path;
  SD_CHECK(!name.empty(), "no model given (expected a pipeline folder, a single-file checkpoint or a Hub name)");
  if (fs::exists(name)) return resolve_path(request, name);  // --revision is for Hub names; diffusers ignores it here
  SD_CHECK(io::is_hub_repo_id(name),
           "{}: not found (expected a diffusers pipeline folder, a single-file checkpoint or a Hub name such as "
           "runwayml/stable-diffusion-v1-5)",
           name);
  return resolve_path(request, io::find_cached_snapshot(name, request.revision));
}

PipelineConfigs read_configs(const ModelSource& source) {
  if (is_single_file(source)) return SingleFileCheckpoint(source.path, source.config_from).configs();
  return read_pipeline_configs(source.path);
}

StableDiffusion load_pipeline(const ModelSource& source, const ComponentDtypes& dtypes, const fs::path& tokenizer_dir) {
  if (is_single_file(source)) return load_single_file(source.path, source.config_from, dtypes, tokenizer_dir);
  return load_pipeline(source.path, dtypes, tokenizer_dir, source.variant);
}

void replace_vae(StableDiffusion& pipe, const fs::path& vae) {
  SD_CHECK(pipe.unet && pipe.vae && pipe.text_encoder, "--vae {}: the pipeline was loaded without its models",
           vae.string());
  const models::VaeConfig model_config = pipe.vae->config();
  const at::ScalarType dtype = pipe.vae->parameters().front().scalar_type();
  if (!fs::is_directory(vae)) {
    SD_CHECK(fs::is_regular_file(vae), "{}: no such VAE file or folder", vae.string());
    const models::LdmNames names(pipe.unet->config(), model_config, pipe.text_encoder->config());
    pipe.vae = models::load_vae(model_config, *single_file_vae(vae, names), dtype);
    return;
  }
  const fs::path dir = fs::exists(vae / "model_index.json") ? vae / "vae" : vae;
  SD_CHECK(fs::is_regular_file(dir / "config.json"),
           "{}: not a VAE folder (no config.json) nor a pipeline folder (no model_index.json)", vae.string());
  const models::VaeConfig given = models::VaeConfig::load((dir / "config.json").string());
  SD_CHECK(given.latent_channels == model_config.latent_channels && given.scale_factor() == model_config.scale_factor(),
           "{}: a VAE of {} latent channels at 1/{} of the image size; the model's has {} at 1/{}", vae.string(),
           given.latent_channels, given.scale_factor(), model_config.latent_channels, model_config.scale_factor());
  pipe.vae = models::load_vae(dir, dtype);
}

void copy_components(const ModelSource& source, const fs::path& to, const std::vector<std::string>& parts) {
  if (!is_single_file(source)) {
    for (const auto& part : parts)
      io::write_directory_atomically(to / part,
                                     [&](const fs::path& tmp) { io::copy_folder(source.path / part, tmp, to / part); });
    return;
  }
  // Only the model components asked for are loaded (in float32), then written as save_pipeline writes them.
  const auto dtype_if_wanted = [&](const char* part) {
    return std::count(parts.begin(), parts.end(), part) ? at::kFloat : at::ScalarType::Undefined;
  };
  StableDiffusion pipe =
      load_single_file(source.path, source.config_from,
                       {dtype_if_wanted("text_encoder"), dtype_if_wanted("vae"), dtype_if_wanted("unet")});
  for (const auto& part : parts)
    io::write_directory_atomically(to / part, [&](const fs::path& tmp) { save_component(pipe, part, tmp); });
}

std::vector<ComponentSummary> summarize_components(const ModelSource& source) {
  std::optional<SingleFileCheckpoint> checkpoint;
  nlohmann::json model_index;
  if (is_single_file(source)) {
    checkpoint.emplace(source.path, source.config_from);
    model_index = model_index_json(checkpoint->configs().scheduler.class_name);
  } else {
    check_pipeline_layout(source.path);
    model_index = io::JsonConfig::load(source.path / "model_index.json").raw();
  }
  const std::pair<Component, bool> parts[] = {
      {Component::kUnet, true}, {Component::kVae, false}, {Component::kTextEncoder, false}};
  std::vector<ComponentSummary> out;
  for (const auto& [component, trainable] : parts) {
    const std::string name = models::component_folder(component);
    ComponentSummary summary;
    summary.name = name;
    summary.class_name = model_index.contains(name) ? model_index[name][1].get<std::string>() : "?";
    summary.trainable = trainable;
    const std::unique_ptr<io::TensorFile> weights =
        checkpoint ? checkpoint->component(component)
                   : models::open_weights(source.path / name, weight_file_names(component), source.variant);
    add_tensors(*weights, summary);
    out.push_back(std::move(summary));
  }
  return out;
}

std::string parameter_line(const std::vector<ComponentSummary>& components) {
  int64_t total = 0, trainable = 0;
  for (const auto& c : components) {
    total += c.parameters;
    if (c.trainable) trainable += c.parameters;
  }
  return fmt::format("Model has {:.6f} M parameters and {:.6f} M trainable", static_cast<double>(total) / 1e6,
                     static_cast<double>(trainable) / 1e6);
}

}  // namespace sd::pipeline
