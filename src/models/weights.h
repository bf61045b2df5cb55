// Loading and saving module weights by their diffusers/transformers names. Loading is strict: every parameter and
// buffer of the module must be in the file with the right shape, and the file may hold nothing else.
#pragma once
#include <torch/nn/module.h>

#include <filesystem>
#include <set>
#include <string>

#include "io/safetensors.h"

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

// Copies every tensor of `file` into the module parameter/buffer of the same name, converted to the module's
// dtype (so F16/BF16 files load into float32 modules and the reverse). Throws one sd::Error line listing the
// missing, unexpected and mis-shaped keys, naming the file.
void load_weights(torch::nn::Module& module, const io::SafeTensorsFile& file);
void load_weights(torch::nn::Module& module, const std::filesystem::path& path);
// The same, but file keys listed in `ignored` are skipped when the module has no such tensor (e.g. the
// `position_ids` buffer older transformers versions saved and 4.35 no longer has).
void load_weights(torch::nn::Module& module, const io::SafeTensorsFile& file, const std::set<std::string>& ignored);

// Every parameter and buffer by name (detached, as stored).
io::TensorMap named_weights(const torch::nn::Module& module);

// Writes named_weights(module) as safetensors, converted to `dtype` (kUndefined keeps each tensor's dtype).
void save_weights(const torch::nn::Module& module, const std::filesystem::path& path,
                  at::ScalarType dtype = at::ScalarType::Undefined);

// Number of parameter elements (buffers excluded), for `inspect` and logs.
int64_t parameter_count(const torch::nn::Module& module);

}  // namespace sd::models
