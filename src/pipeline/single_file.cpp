#include "pipeline/single_file.h"

#include <c10/util/accumulate.h>
#include <unistd.h>

#include <algorithm>

#include "core/error.h"
#include "models/weights.h"
#include "pipeline/presets.h"

namespace sd::pipeline {

namespace fs = std::filesystem;
using models::Component;

namespace {

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

bool has_key_starting(const io::TensorFile& file, const std::string& prefix) {
  return std::any_of(file.names().begin(), file.names().end(),
                     [&](const std::string& name) { return starts_with(name, prefix); });
}

models::TextEncoderLayout text_encoder_layout_of(const io::TensorFile& file) {
  return has_key_starting(file, "cond_stage_model.model.") ? models::TextEncoderLayout::kOpenClip
                                                           : models::TextEncoderLayout::kOpenAiClip;
}

// One component of a single file under its diffusers names: each tensor read from its LDM key, split out of a
// fused q/k/v tensor or reshaped from a 1x1 convolution as the name mapping says.
class ComponentView : public io::TensorFile {
 public:
  ComponentView(std::shared_ptr<const io::TensorFile> checkpoint, const models::LdmNames& names, Component component)
      : checkpoint_(std::move(checkpoint)), component_(component) {
    for (const auto& key : checkpoint_->names())
      for (const auto& [part, name] : names.to_diffusers(key)) {
        if (part != component) continue;
        models::LdmLocation where = names.to_ldm(part, name);
        where.key = key;  // the key as this file spells it (to_ldm gives the current spelling of older ones)
        if (locations_.emplace(name, where).second) names_.push_back(name);
      }
  }

  std::string label() const override {
    return fmt::format("{} ({} part)", checkpoint_->label(), models::component_folder(component_));
  }
  const std::vector<std::string>& names() const override { return names_; }
  bool contains(const std::string& name) const override { return locations_.count(name) > 0; }
  const std::map<std::string, std::string>& metadata() const override { return checkpoint_->metadata(); }

  io::TensorInfo info(const std::string& name) const override {
    const models::LdmLocation& where = location(name);
    io::TensorInfo info = checkpoint_->info(where.key);
    SD_CHECK(!info.shape.empty() && info.shape[0] % where.chunks == 0, "{}: '{}' has shape [{}], not {} equal parts",
             checkpoint_->label(), where.key, fmt::join(info.shape, ", "), where.chunks);
    info.shape[0] /= where.chunks;
    if (where.conv1x1) {
      SD_CHECK(info.shape.size() == 4 && info.shape[2] == 1 && info.shape[3] == 1,
               "{}: '{}' has shape [{}], expected a 1x1 convolution [out, in, 1, 1]", checkpoint_->label(), where.key,
               fmt::join(info.shape, ", "));
      info.shape.resize(2);
    }
    return info;
  }

  at::Tensor read(const std::string& name) const override {
    const models::LdmLocation& where = location(name);
    const io::TensorInfo shape = info(name);
    at::Tensor tensor = checkpoint_->read(where.key);
    if (where.chunks > 1) tensor = tensor.chunk(where.chunks, 0)[where.chunk].contiguous();
    return tensor.reshape(shape.shape);
  }

 private:
  const models::LdmLocation& location(const std::string& name) const {
    auto it = locations_.find(name);
    SD_CHECK(it != locations_.end(), "{}: no tensor named '{}'", label(), name);
    return it->second;
  }

  std::shared_ptr<const io::TensorFile> checkpoint_;
  Component component_;
  std::map<std::string, models::LdmLocation> locations_;
  std::vector<std::string> names_;
};

// A file's tensors under `prefix` + their names: a VAE saved alone in the original layout, read as the
// first_stage_model.* part of a checkpoint.
class PrefixedFile : public io::TensorFile {
 public:
  PrefixedFile(std::shared_ptr<const io::TensorFile> file, std::string prefix)
      : file_(std::move(file)), prefix_(std::move(prefix)) {
    for (const auto& name : file_->names()) names_.push_back(prefix_ + name);
  }

  std::string label() const override { return file_->label(); }
  const std::vector<std::string>& names() const override { return names_; }
  bool contains(const std::string& name) const override {
    return starts_with(name, prefix_) && file_->contains(unprefixed(name));
  }
  io::TensorInfo info(const std::string& name) const override { return file_->info(unprefixed(name)); }
  at::Tensor read(const std::string& name) const override { return file_->read(unprefixed(name)); }
  const std::map<std::string, std::string>& metadata() const override { return file_->metadata(); }

 private:
  std::string unprefixed(const std::string& name) const {
    SD_CHECK(starts_with(name, prefix_), "{}: no tensor named '{}'", file_->label(), name);
    return name.substr(prefix_.size());
  }

  std::shared_ptr<const io::TensorFile> file_;
  std::string prefix_;
  std::vector<std::string> names_;
};

// The preset whose UNet has as many parameters as the file's and whose text encoder has the file's layout. SD-2
// base and 768-v share every shape: as diffusers does, a checkpoint saved at global step 875000 is taken for the
// base model and any other for 768-v.
std::string matching_preset(const io::TensorFile& file) {
  int64_t unet_parameters = 0;
  for (const auto& name : file.names()) {
    const io::TensorInfo info = file.info(name);
    if (!starts_with(name, "model.diffusion_model.") || !at::isFloatingType(info.dtype)) continue;
    unet_parameters += c10::multiply_integers(info.shape);
  }
  std::vector<std::string> fits;
  for (const auto& name : preset_names()) {
    const PipelineConfigs preset = preset_configs(name);
    if (models::count_parameters(preset.unet) == unet_parameters &&
        models::text_encoder_layout(preset.text_encoder) == text_encoder_layout_of(file))
      fits.push_back(name);
  }
  SD_CHECK(!fits.empty(),
           "{}: its UNet ({} parameters) matches none of the known architectures ({}); give --config_from with a "
           "diffusers pipeline folder holding this model's configs",
           file.label(), unet_parameters, fmt::join(preset_names(), ", "));
  if (fits.size() == 1) return fits.front();
  const auto step = file.metadata().find("global_step");
  return step != file.metadata().end() && step->second == "875000" ? "sd2-base" : "sd2-768-v";
}

std::shared_ptr<const io::TensorFile> open_checkpoint(const fs::path& file) {
  std::shared_ptr<const io::TensorFile> checkpoint = io::open_tensor_file(file);
  SD_CHECK(has_key_starting(*checkpoint, "model.diffusion_model."),
           "{}: not a single-file Stable Diffusion checkpoint (no model.diffusion_model.* tensors)", file.string());
  return checkpoint;
}

PipelineConfigs configs_for(const io::TensorFile& checkpoint, const fs::path& config_from) {
  const PipelineConfigs configs =
      config_from.empty() ? preset_configs(matching_preset(checkpoint)) : read_pipeline_configs(config_from);
  const models::TextEncoderLayout stored = text_encoder_layout_of(checkpoint);
  const models::TextEncoderLayout configured = models::text_encoder_layout(configs.text_encoder);
  SD_CHECK(stored == configured, "{}: the file holds an {} text encoder but the configs describe an {} one",
           checkpoint.label(), models::describe(stored), models::describe(configured));
  return configs;
}

text::ClipTokenizer single_file_tokenizer(const fs::path& tokenizer_dir, const fs::path& config_from, bool sd2) {
  if (!tokenizer_dir.empty()) return text::ClipTokenizer::load(tokenizer_dir);
  if (!config_from.empty()) return text::ClipTokenizer::load(config_from / "tokenizer");
  // A preset's tokenizer exists only as files: write them to a scratch folder and read them back.
  const fs::path scratch = fs::temp_directory_path() / fmt::format("sdtrain-tokenizer-{}", getpid());
  try {
    write_preset_tokenizer(scratch, sd2);
    text::ClipTokenizer tokenizer = text::ClipTokenizer::load(scratch);
    fs::remove_all(scratch);
    return tokenizer;
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(scratch, ignored);
    throw;
  }
}

// The pieces of one LDM tensor (one, or q/k/v chunks) put together in the LDM shape.
at::Tensor assemble(const std::string& key, std::vector<std::pair<models::LdmLocation, at::Tensor>> pieces) {
  std::sort(pieces.begin(), pieces.end(), [](const auto& a, const auto& b) { return a.first.chunk < b.first.chunk; });
  std::vector<at::Tensor> chunks;
  for (size_t i = 0; i < pieces.size(); ++i) {
    SD_CHECK(pieces[i].first.chunk == static_cast<int>(i) && pieces[i].first.chunks == static_cast<int>(pieces.size()),
             "cannot assemble '{}' in the single-file layout: its parts are incomplete", key);
    chunks.push_back(pieces[i].second);
  }
  at::Tensor tensor = chunks.size() == 1 ? chunks.front() : at::cat(chunks, 0);
  return pieces.front().first.conv1x1 ? tensor.reshape({tensor.size(0), tensor.size(1), 1, 1}) : tensor;
}

}  // namespace

SingleFileCheckpoint::SingleFileCheckpoint(const fs::path& file, const fs::path& config_from)
    : file_(file),
      config_from_(config_from),
      checkpoint_(open_checkpoint(file)),
      configs_(configs_for(*checkpoint_, config_from)),
      names_(configs_.unet, configs_.vae, configs_.text_encoder) {}

std::unique_ptr<io::TensorFile> SingleFileCheckpoint::component(Component component) const {
  return std::make_unique<ComponentView>(checkpoint_, names_, component);
}

StableDiffusion SingleFileCheckpoint::load(const ComponentDtypes& dtypes, const fs::path& tokenizer_dir) const {
  StableDiffusion pipe{model_index_json(configs_.scheduler.class_name),
                       single_file_tokenizer(tokenizer_dir, config_from_, configs_.sd2_tokenizer),
                       nullptr,
                       nullptr,
                       nullptr,
                       configs_.scheduler};
  if (dtypes.text_encoder != at::ScalarType::Undefined)
    pipe.text_encoder =
        models::load_text_encoder(configs_.text_encoder, *component(Component::kTextEncoder), dtypes.text_encoder);
  if (dtypes.vae != at::ScalarType::Undefined)
    pipe.vae = models::load_vae(configs_.vae, *component(Component::kVae), dtypes.vae);
  if (dtypes.unet != at::ScalarType::Undefined)
    pipe.unet = models::load_unet(configs_.unet, *component(Component::kUnet), dtypes.unet);
  check_components_fit(pipe, file_.string());
  return pipe;
}

StableDiffusion load_single_file(const fs::path& file, const fs::path& config_from, const ComponentDtypes& dtypes,
                                 const fs::path& tokenizer_dir) {
  return SingleFileCheckpoint(file, config_from).load(dtypes, tokenizer_dir);
}

std::unique_ptr<io::TensorFile> single_file_vae(const fs::path& file, const models::LdmNames& names) {
  std::unique_ptr<io::TensorFile> opened = io::open_tensor_file(file);
  if (has_key_starting(*opened, "encoder.down_blocks.")) return opened;  // diffusers' names already
  std::shared_ptr<const io::TensorFile> shared = std::move(opened);
  if (has_key_starting(*shared, "first_stage_model."))
    return std::make_unique<ComponentView>(shared, names, Component::kVae);
  SD_CHECK(has_key_starting(*shared, "encoder.down.") && has_key_starting(*shared, "decoder.up."),
           "{}: not a VAE (expected a checkpoint's first_stage_model.* tensors, or a VAE's encoder.* and decoder.* "
           "tensors in the original or the diffusers layout)",
           file.string());
  return std::make_unique<ComponentView>(std::make_shared<PrefixedFile>(shared, "first_stage_model."), names,
                                         Component::kVae);
}

void save_single_file(StableDiffusion& pipe, const fs::path& file, at::ScalarType dtype) {
  const models::LdmNames names(pipe.unet->config(), pipe.vae->config(), pipe.text_encoder->config());
  std::map<std::string, std::vector<std::pair<models::LdmLocation, at::Tensor>>> pieces;
  const std::pair<Component, const torch::nn::Module*> parts[] = {{Component::kUnet, pipe.unet.get()},
                                                                  {Component::kVae, pipe.vae.get()},
                                                                  {Component::kTextEncoder, pipe.text_encoder.get()}};
  for (const auto& [component, module] : parts)
    for (const auto& [name, tensor] : models::named_weights(*module)) {
      models::LdmLocation where = names.to_ldm(component, name);
      pieces[where.key].emplace_back(where, tensor);
    }
  io::TensorMap tensors;
  for (auto& [key, parts_of_key] : pieces) {
    at::Tensor tensor = assemble(key, std::move(parts_of_key));
    tensors[key] = tensor.is_floating_point() ? tensor.to(dtype) : tensor;
  }
  // As the reference conversion script writes it: no metadata.
  io::save_safetensors(file, tensors, {});
}

}  // namespace sd::pipeline
