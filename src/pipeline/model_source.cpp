#include "pipeline/model_source.h"

#include "core/error.h"
#include "io/hub_cache.h"
#include "pipeline/single_file.h"

namespace sd::pipeline {

namespace fs = std::filesystem;

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

}  // namespace

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
  if (source.kind == ModelSource::Kind::kPipelineFolder) return read_pipeline_configs(source.path);
  return single_file_configs(*io::open_tensor_file(source.path), source.config_from);
}

StableDiffusion load_pipeline(const ModelSource& source, const ComponentDtypes& dtypes, const fs::path& tokenizer_dir) {
  if (source.kind == ModelSource::Kind::kPipelineFolder)
    return load_pipeline(source.path, dtypes, tokenizer_dir, source.variant);
  return load_single_file(source.path, source.config_from, dtypes, tokenizer_dir);
}

void write_component(const ModelSource& source, const std::string& component, const fs::path& dir) {
  if (source.kind == ModelSource::Kind::kPipelineFolder) {
    fs::copy(source.path / component, dir, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
    return;
  }
  StableDiffusion pipe = load_single_file(source.path, source.config_from);
  save_component(pipe, component, dir);
}

}  // namespace sd::pipeline
