// Loading and saving module weights by their diffusers/transformers names, and picking a component's weight files
// as diffusers does. Loading is strict: every parameter and buffer of the module must be in the file with the right
// shape, and the file may hold nothing else.
#pragma once
#include <torch/nn/module.h>

#include <filesystem>
#include <memory>
#include <set>
#include <string>

#include "io/safetensors.h"
#include "io/tensor_file.h"

namespace sd::models {

// While alive, modules are constructed with parameters of `dtype` (LibTorch's default dtype), so a model meant to
// run in bf16 never holds a float32 copy of its weights, not even while it is built.
class ScopedDefaultDtype {
 public:
  explicit ScopedDefaultDtype(at::ScalarType dtype);
  ~ScopedDefaultDtype();
  ScopedDefaultDtype(const ScopedDefaultDtype&) = delete;
  ScopedDefaultDtype& operator=(const ScopedDefaultDtype&) = delete;

 private:
  caffe2::TypeMeta previous_;
};

// Gives every tensor of `file` to the module parameter/buffer of the same name: of the module's dtype it becomes the
// parameter's data (a large safetensors tensor stays a copy-on-write mapping of the file), otherwise it is copied,
// converted (so F16/BF16 files load into float32 modules and the reverse). Throws one sd::Error line listing the
// missing, unexpected and mis-shaped keys, naming the file.
// File keys listed in `ignored` are skipped when the module has no such tensor (e.g. the `position_ids` buffer older
// transformers versions saved and 4.35 no longer has).
void load_weights(torch::nn::Module& module, const io::TensorFile& file, const std::set<std::string>& ignored = {});
void load_weights(torch::nn::Module& module, const std::filesystem::path& path);

// Every parameter and buffer by name (detached, as stored).
io::TensorMap named_weights(const torch::nn::Module& module);

// Writes named_weights(module) as safetensors, converted to `dtype` (kUndefined keeps each tensor's dtype).
void save_weights(const torch::nn::Module& module, const std::filesystem::path& path,
                  at::ScalarType dtype = at::ScalarType::Undefined);

// The names a component's weights are saved under: diffusers models use diffusion_pytorch_model.{safetensors,bin},
// transformers models model.safetensors and pytorch_model.bin.
struct WeightFileNames {
  std::string safetensors;
  std::string pickle;

  static WeightFileNames diffusers();
  static WeightFileNames transformers();
};

// The file name of a variant, as diffusers' _add_variant: ("model.safetensors", "fp16") -> "model.fp16.safetensors",
// ("model.safetensors.index.json", "fp16") -> "model.safetensors.index.fp16.json"; an empty variant changes nothing.
std::string with_variant(const std::string& file_name, const std::string& variant);

// diffusers' test for a component folder having `variant`: some file's second dot-separated part starts with it
// ("diffusion_pytorch_model.fp16.safetensors", "model.fp16-00001-of-00002.safetensors").
bool has_variant_files(const std::filesystem::path& dir, const std::string& variant);

// Opens the weights of the component folder `dir` as diffusers 0.24 / transformers 4.35 pick them: safetensors before
// a torch.save .bin, a single file before a sharded *.index.json. With a variant, its files are used, unless the
// folder holds no file of that variant at all: then, as diffusers does, the component loads without it.
std::unique_ptr<io::TensorFile> open_weights(const std::filesystem::path& dir, const WeightFileNames& names,
                                             const std::string& variant = "");

// Number of parameter elements (buffers excluded), for `inspect` and logs.
int64_t parameter_count(const torch::nn::Module& module);

}  // namespace sd::models
