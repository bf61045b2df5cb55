#include "models/weights.h"

#include <torch/nn.h>

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

}  // namespace

ScopedDefaultDtype::ScopedDefaultDtype(at::ScalarType dtype) : previous_(c10::get_default_dtype()) {
  c10::set_default_dtype(c10::scalarTypeToTypeMeta(dtype));
}

ScopedDefaultDtype::~ScopedDefaultDtype() { c10::set_default_dtype(previous_); }

io::TensorMap named_weights(const torch::nn::Module& module) {
  io::TensorMap out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) out[item.key()] = item.value().detach();
  for (const auto& item : module.named_buffers(/*recurse=*/true)) out[item.key()] = item.value().detach();
  return out;
}

void load_weights(torch::nn::Module& module, const io::SafeTensorsFile& file) { load_weights(module, file, {}); }

void load_weights(torch::nn::Module& module, const io::SafeTensorsFile& file, const std::set<std::string>& ignored) {
  io::TensorMap targets = named_weights(module);
  std::vector<std::string> missing, unexpected, misshaped;
  for (const auto& [name, target] : targets) {
    if (!file.contains(name)) {
      missing.push_back(name);
    } else if (at::IntArrayRef(file.entry(name).shape) != target.sizes()) {
      misshaped.push_back(
          fmt::format("{} (file {}, model {})", name, shape_str(file.entry(name).shape), shape_str(target.sizes())));
    }
  }
  for (const auto& name : file.names())
    if (!targets.count(name) && !ignored.count(name)) unexpected.push_back(name);
  if (!missing.empty() || !unexpected.empty() || !misshaped.empty()) {
    std::vector<std::string> parts;
    if (!misshaped.empty()) parts.push_back("wrong shape: " + list_some(misshaped));
    if (!missing.empty()) parts.push_back("missing keys: " + list_some(missing));
    if (!unexpected.empty()) parts.push_back("unexpected keys: " + list_some(unexpected));
    fail("{}: weights do not match the model config: {}", file.path().string(), fmt::join(parts, "; "));
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, target] : targets) target.copy_(file.read(name));
}

void load_weights(torch::nn::Module& module, const std::filesystem::path& path) {
  load_weights(module, io::SafeTensorsFile(path));
}

void save_weights(const torch::nn::Module& module, const std::filesystem::path& path, at::ScalarType dtype) {
  io::TensorMap tensors = named_weights(module);
  if (dtype != at::ScalarType::Undefined)
    for (auto& [name, t] : tensors)
      if (t.is_floating_point()) t = t.to(dtype);
  io::save_safetensors(path, tensors);
}

int64_t parameter_count(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters(/*recurse=*/true)) n += p.numel();
  return n;
}

}  // namespace sd::models
