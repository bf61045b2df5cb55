// Named tensors read on demand, whatever holds them: a safetensors file, a torch.save zip-pickle, a sharded
// checkpoint, or a renamed part of a single-file checkpoint. Loaders see only this interface, so every format loads
// through the same strict weight matching, one tensor at a time.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace sd::io {

struct TensorInfo {
  at::ScalarType dtype;
  std::vector<int64_t> shape;
};

class TensorFile {
 public:
  virtual ~TensorFile() = default;
  // What error messages call it: the path, or e.g. "model.ckpt (unet)".
  virtual std::string label() const = 0;
  // Tensor names, each once.
  virtual const std::vector<std::string>& names() const = 0;
  virtual bool contains(const std::string& name) const = 0;
  // dtype and shape without reading the data; an unknown name throws sd::Error.
  virtual TensorInfo info(const std::string& name) const = 0;
  // The tensor in its stored dtype, contiguous and owning its memory.
  virtual at::Tensor read(const std::string& name) const = 0;
  // String metadata (safetensors' __metadata__, a checkpoint's scalar entries such as global_step).
  virtual const std::map<std::string, std::string>& metadata() const = 0;
};

// Opens a safetensors file or a torch.save zip-pickle (.bin, .pt, .ckpt), told apart by their first bytes, or a
// sharded checkpoint's *.index.json.
std::unique_ptr<TensorFile> open_tensor_file(const std::filesystem::path& path);

// How many NaN and infinite values a tensor holds (0 for integer tensors). Read from the bits, in one parallel pass
// without temporaries: at::isfinite(t).sum() made a bool copy and reduced it, 5.5 s over SD-1.5's UNet on a 2-core VM.
int64_t count_nonfinite(const at::Tensor& tensor);

// Throws sd::Error naming `label` (the file) and tensor `name` when a floating-point tensor holds NaN or infinite
// values: weights like that can only give NaN images or a NaN loss, so they stop a command before it runs.
void check_finite(const at::Tensor& tensor, const std::string& label, const std::string& name);

}  // namespace sd::io
