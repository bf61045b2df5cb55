#include "pipeline/lora_file.h"

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "io/safetensors.h"
#include "io/tensor_file.h"
#include "models/lora.h"

namespace sd::pipeline {

namespace fs = std::filesystem;

namespace {

const char* component_label(LoraComponent c) { return c == LoraComponent::kUNet ? "the UNet" : "the text encoder"; }

std::string underscored(std::string path) {
  std::replace(path.begin(), path.end(), '.', '_');
  return path;
}

std::string kohya_stem(LoraComponent c, const std::string& module) {
  return (c == LoraComponent::kUNet ? "lora_unet_" : "lora_te_") + underscored(module);
}

torch::nn::Module& model_of(StableDiffusion& pipe, LoraComponent c) {
  if (c == LoraComponent::kUNet) {
    SD_CHECK(!pipe.unet.is_empty(), "a UNet LoRA needs the pipeline's UNet");
    return *pipe.unet;
  }
  SD_CHECK(!pipe.text_encoder.is_empty(), "a text-encoder LoRA needs the pipeline's text encoder");
  return *pipe.text_encoder;
}

std::map<std::string, models::LoraHost*> hosts_by_path(StableDiffusion& pipe, LoraComponent c) {
  std::map<std::string, models::LoraHost*> hosts;
  for (const auto& [path, host] : models::lora_hosts(model_of(pipe, c))) hosts[path] = host;
  return hosts;
}

enum class Part { kDown, kUp, kAlpha };

// Where one key of a file goes.
struct KeyTarget {
  LoraComponent component;
  std::string module;
  Part part;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// unet.<module>.lora.down.weight and the other spellings diffusers has used; nullopt for anything else.
std::optional<KeyTarget> parse_diffusers_key(const std::string& key) {
  static const std::vector<std::pair<std::string, LoraComponent>> prefixes = {
      {"unet.", LoraComponent::kUNet}, {"text_encoder.", LoraComponent::kTextEncoder}};
  static const std::vector<std::pair<std::string, Part>> suffixes = {{".lora.down.weight", Part::kDown},
                                                                     {".lora.up.weight", Part::kUp},
                                                                     {".lora_linear_layer.down.weight", Part::kDown},
                                                                     {".lora_linear_layer.up.weight", Part::kUp},
                                                                     {".lora_A.weight", Part::kDown},
                                                                     {".lora_B.weight", Part::kUp}};
  for (const auto& [prefix, component] : prefixes) {
    if (key.rfind(prefix, 0) != 0) continue;
    for (const auto& [suffix, part] : suffixes)
      if (ends_with(key, suffix) && key.size() > prefix.size() + suffix.size())
        return KeyTarget{component, key.substr(prefix.size(), key.size() - prefix.size() - suffix.size()), part};
  }
  return std::nullopt;
}

// lora_unet_<module with _>.lora_down.weight etc.; the module path is found among the model's layers (`paths`:
// kohya stem -> module path, over both components). nullopt for a key of another shape.
std::optional<KeyTarget> parse_kohya_key(const std::string& key,
                                         const std::map<std::string, std::pair<LoraComponent, std::string>>& paths,
                                         const std::string& file) {
  static const std::vector<std::pair<std::string, Part>> suffixes = {
      {".lora_down.weight", Part::kDown}, {".lora_up.weight", Part::kUp}, {".alpha", Part::kAlpha}};
  if (key.rfind("lora_unet_", 0) != 0 && key.rfind("lora_te_", 0) != 0) return std::nullopt;
  for (const auto& [suffix, part] : suffixes) {
    if (!ends_with(key, suffix)) continue;
    const std::string stem = key.substr(0, key.size() - suffix.size());
    const auto it = paths.find(stem);
    SD_CHECK(it != paths.end(), "{}: '{}': {} has no Linear or Conv2d layer named {}", file, key,
             component_label(stem.rfind("lora_unet_", 0) == 0 ? LoraComponent::kUNet : LoraComponent::kTextEncoder),
             stem);
    return KeyTarget{it->second.first, it->second.second, part};
  }
  return std::nullopt;
}

// Kohya stem of every adaptable layer of the pipeline's models.
std::map<std::string, std::pair<LoraComponent, std::string>> kohya_paths(StableDiffusion& pipe) {
  std::map<std::string, std::pair<LoraComponent, std::string>> paths;
  for (LoraComponent c : {LoraComponent::kUNet, LoraComponent::kTextEncoder})
    for (const auto& [path, host] : hosts_by_path(pipe, c)) paths[kohya_stem(c, path)] = {c, path};
  return paths;
}

// A LoRA file, or the one diffusers' load_lora_weights reads from a folder.
fs::path lora_file_in(const fs::path& path) {
  if (!fs::is_directory(path)) {
    SD_CHECK(fs::is_regular_file(path), "{}: no such LoRA file", path.string());
    return path;
  }
  for (const char* name : {"pytorch_lora_weights.safetensors", "pytorch_lora_weights.bin"})
    if (fs::is_regular_file(path / name)) return path / name;
  fail("{}: a folder without pytorch_lora_weights.safetensors or pytorch_lora_weights.bin", path.string());
}

}  // namespace

LoraFormat parse_lora_format(const std::string& name) {
  if (name == "diffusers") return LoraFormat::kDiffusers;
  if (name == "kohya") return LoraFormat::kKohya;
  fail("--lora_format: expected diffusers or kohya, got '{}'", name);
}

std::string diffusers_lora_key(LoraComponent component, const std::string& module, const std::string& part) {
  // diffusers 0.24 names the text encoder's adapters after its PatchedLoraProjection.lora_linear_layer.
  if (component == LoraComponent::kUNet) return fmt::format("unet.{}.lora.{}.weight", module, part);
  return fmt::format("text_encoder.{}.lora_linear_layer.{}.weight", module, part);
}

void save_lora_file(const fs::path& path, const LoraWeights& weights, LoraFormat format,
                    const std::map<std::string, std::string>& metadata) {
  io::TensorMap tensors;
  for (const LoraModule& m : weights) {
    const at::Tensor down = m.down.to(at::kFloat), up = m.up.to(at::kFloat);
    if (format == LoraFormat::kDiffusers) {
      const double rank = static_cast<double>(down.size(0));
      tensors[diffusers_lora_key(m.component, m.module, "down")] = down;
      tensors[diffusers_lora_key(m.component, m.module, "up")] = m.alpha == rank ? up : up * (m.alpha / rank);
    } else {
      const std::string stem = kohya_stem(m.component, m.module);
      tensors[stem + ".lora_down.weight"] = down;
      tensors[stem + ".lora_up.weight"] = up;
      tensors[stem + ".alpha"] = at::scalar_tensor(m.alpha, at::kFloat);
    }
  }
  std::map<std::string, std::string> header = metadata;
  header["format"] = "pt";
  io::save_safetensors(path, tensors, header);
}

LoraWeights load_lora_file(const fs::path& given, StableDiffusion& pipe) {
  const fs::path path = lora_file_in(given);
  const std::unique_ptr<io::TensorFile> opened = io::open_tensor_file(path);
  const io::TensorFile& file = *opened;
  const std::string name = path.string();
  std::optional<std::map<std::string, std::pair<LoraComponent, std::string>>> kohya;  // built on the first kohya key
  struct Pending {
    at::Tensor down, up;
    std::optional<double> alpha;
  };
  std::map<std::pair<LoraComponent, std::string>, Pending> modules;
  for (const std::string& key : file.names()) {
    std::optional<KeyTarget> target = parse_diffusers_key(key);
    if (!target && key.rfind("lora_", 0) == 0) {
      if (!kohya) kohya = kohya_paths(pipe);
      target = parse_kohya_key(key, *kohya, name);
    }
    SD_CHECK(target,
             "{}: unknown key '{}' (expected diffusers' unet.<module>.lora.down.weight or kohya's "
             "lora_unet_<module>.lora_down.weight and their text-encoder and up/alpha twins)",
             name, key);
    Pending& m = modules[{target->component, target->module}];
    const at::Tensor value = file.read(key).to(at::kFloat);
    if (target->part == Part::kDown) m.down = value;
    if (target->part == Part::kUp) m.up = value;
    if (target->part == Part::kAlpha) {
      SD_CHECK(value.numel() == 1, "{}: '{}': alpha must be a single number, got {} values", name, key, value.numel());
      m.alpha = value.item<double>();
    }
  }
  SD_CHECK(!modules.empty(), "{}: no LoRA weights in the file", name);
  LoraWeights weights;
  for (auto& [where, m] : modules) {
    SD_CHECK(m.down.defined() && m.up.defined(), "{}: layer {} has {} weight but no {} weight", name, where.second,
             m.down.defined() ? "a down" : "an up", m.down.defined() ? "up" : "down");
    SD_CHECK(m.down.dim() >= 2, "{}: layer {}: the down weight must be [rank, in] or [rank, in, kh, kw]", name,
             where.second);
    const double rank = static_cast<double>(m.down.size(0));
    weights.push_back({where.first, where.second, m.down, m.up, m.alpha.value_or(rank)});
  }
  return weights;
}

void attach_lora(StableDiffusion& pipe, const LoraWeights& weights, double scale, const std::string& source) {
  std::map<LoraComponent, std::map<std::string, models::LoraHost*>> hosts;
  for (const LoraModule& m : weights) {
    if (!hosts.count(m.component)) hosts[m.component] = hosts_by_path(pipe, m.component);
    const auto it = hosts[m.component].find(m.module);
    SD_CHECK(it != hosts[m.component].end(), "{}: {} has no Linear or Conv2d layer '{}'", source,
             component_label(m.component), m.module);
    it->second->add_adapter({m.down, m.up, m.alpha, scale}, source + ": " + m.module);
  }
}

void apply_lora_files(StableDiffusion& pipe, const std::vector<std::string>& files, const std::vector<double>& scales,
                      bool fuse) {
  SD_CHECK(scales.empty() || scales.size() == files.size(),
           "--lora_scale given {} time(s) for {} --lora file(s): give one scale per --lora, in the same order",
           scales.size(), files.size());
  for (size_t i = 0; i < files.size(); ++i)
    attach_lora(pipe, load_lora_file(files[i], pipe), scales.empty() ? 1.0 : scales[i], files[i]);
  if (!fuse) return;
  models::merge_adapters(*pipe.unet);
  models::merge_adapters(*pipe.text_encoder);
}

}  // namespace sd::pipeline
