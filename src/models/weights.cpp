#include "models/weights.h"

#include <torch/nn.h>

#include <algorithm>

#include "core/error.h"

namespace sd::models {

namespace {

// "a, b, c and 12 more": keeps the one-line error readable for a completely wrong file.
std::string list_some(const std::vector<std::string>& items, size_t limit = 5) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < limit; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > limit) out += fmt::format(" and {} more", items.size() - limit);
  return out;
}

std::string shape_str(at::IntArrayRef shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

// The module's own parameter and buffer tensors (not detached copies of their handles), so set_data reaches them.
io::TensorMap module_tensors(const torch::nn::Module& module) {
  io::TensorMap out;
  for (auto& item : module.named_parameters(/*recurse=*/true)) out[item.key()] = item.value();
  for (auto& item : module.named_buffers(/*recurse=*/true)) out[item.key()] = item.value();
  return out;
}

// A stored tensor of the target's dtype becomes the target's data (the file's memory, often the page cache mapped
// copy-on-write): copying it would first make the kernel clear as many fresh pages, most of a model's load time.
void take_stored_values(at::Tensor& target, const at::Tensor& stored) {
  if (stored.scalar_type() == target.scalar_type() && stored.device() == target.device() && target.is_contiguous())
    target.set_data(stored);
  else
    target.copy_(stored);
}

}  // namespace

ScopedDefaultDtype::ScopedDefaultDtype(at::ScalarType dtype) : previous_(c10::get_default_dtype()) {
  c10::set_default_dtype(c10::scalarTypeToTypeMeta(dtype));
}

ScopedDefaultDtype::~ScopedDefaultDtype() { c10::set_default_dtype(previous_); }

io::TensorMap named_weights(const torch::nn::Module& module) {
  io::TensorMap out = module_tensors(module);
  for (auto& [name, tensor] : out) tensor = tensor.detach();
  return out;
}

void load_weights(torch::nn::Module& module, const io::TensorFile& file, const std::set<std::string>& ignored) {
  io::TensorMap targets = module_tensors(module);
  std::vector<std::string> missing, unexpected, misshaped, mistyped;
  for (const auto& [name, target] : targets) {
    if (!file.contains(name)) {
      missing.push_back(name);
      continue;
    }
    const io::TensorInfo stored = file.info(name);
    if (at::IntArrayRef(stored.shape) != target.sizes())
      misshaped.push_back(
          fmt::format("{} (file {}, model {})", name, shape_str(stored.shape), shape_str(target.sizes())));
    // Integers would be cast to weights silently (an I32 bias of 1e9s).
    if (target.is_floating_point() && !at::isFloatingType(stored.dtype))
      mistyped.push_back(
          fmt::format("{} ({} in the file, expected a floating-point type)", name, c10::toString(stored.dtype)));
  }
  for (const auto& name : file.names())
    if (!targets.count(name) && !ignored.count(name)) unexpected.push_back(name);
  if (!missing.empty() || !unexpected.empty() || !misshaped.empty() || !mistyped.empty()) {
    std::vector<std::string> parts;
    if (!misshaped.empty()) parts.push_back("wrong shape: " + list_some(misshaped));
    if (!mistyped.empty()) parts.push_back("wrong dtype: " + list_some(mistyped));
    if (!missing.empty()) parts.push_back("missing keys: " + list_some(missing));
    if (!unexpected.empty()) parts.push_back("unexpected keys: " + list_some(unexpected));
    fail("{}: weights do not match the model config: {}", file.label(), fmt::join(parts, "; "));
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, target] : targets) {
    const at::Tensor stored = file.read(name);
    io::check_finite(stored, file.label(), name);
    take_stored_values(target, stored);
  }
}

void load_weights(torch::nn::Module& module, const std::filesystem::path& path) {
  load_weights(module, *io::open_tensor_file(path));
}

void save_weights(const torch::nn::Module& module, const std::filesystem::path& path, at::ScalarType dtype) {
  io::TensorMap tensors = named_weights(module);
  if (dtype != at::ScalarType::Undefined)
    for (auto& [name, t] : tensors)
      if (t.is_floating_point()) t = t.to(dtype);
  io::save_safetensors(path, tensors);
}

WeightFileNames WeightFileNames::diffusers() {
  return {"diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin"};
}

WeightFileNames WeightFileNames::transformers() { return {"model.safetensors", "pytorch_model.bin"}; }

std::string with_variant(const std::string& file_name, const std::string& variant) {
  if (variant.empty()) return file_name;
  const size_t dot = file_name.rfind('.');
  return file_name.substr(0, dot) + "." + variant + file_name.substr(dot);
}

bool has_variant_files(const std::filesystem::path& dir, const std::string& variant) {
  std::error_code ec;
  for (const auto& file : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = file.path().filename().string();
    const size_t first = name.find('.');
    if (first != std::string::npos && name.compare(first + 1, variant.size(), variant) == 0) return true;
  }
  return false;
}

namespace {

std::vector<std::string> weight_files_in(const std::filesystem::path& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& file : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = file.path().filename().string(), ext = file.path().extension().string();
    const bool shard_index = ext == ".json" && name.find(".index.") != std::string::npos;  // not config.json
    if (ext == ".safetensors" || ext == ".bin" || shard_index) found.push_back(name);
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace

std::unique_ptr<io::TensorFile> open_weights(const std::filesystem::path& dir, const WeightFileNames& names,
                                             const std::string& variant) {
  const std::string used = variant.empty() || has_variant_files(dir, variant) ? variant : "";
  const std::vector<std::string> candidates = {
      with_variant(names.safetensors, used), with_variant(names.safetensors + ".index.json", used),
      with_variant(names.pickle, used), with_variant(names.pickle + ".index.json", used)};
  for (const auto& name : candidates)
    if (std::filesystem::is_regular_file(dir / name)) return io::open_tensor_file(dir / name);
  const std::vector<std::string> present = weight_files_in(dir);
  fail("{}: missing file (the weights; nor is there {}; the folder holds {}){}", (dir / candidates[0]).string(),
       fmt::join(candidates.begin() + 1, candidates.end(), ", "),
       present.empty() ? "no weight files" : list_some(present),
       variant.empty() && !present.empty() ? "; to load a variant such as fp16 give --variant" : "");
}

int64_t parameter_count(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters(/*recurse=*/true)) n += p.numel();
  return n;
}

}  // namespace sd::models
