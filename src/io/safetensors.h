// The safetensors format: u64-LE header length, a JSON header {name: {dtype, shape, data_offsets}, __metadata__},
// then raw little-endian tensor data. Reading validates the header completely before touching any data, then maps
// each large tensor copy-on-write and copies each small one into its own storage.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "io/random_access_file.h"
#include "io/tensor_file.h"

namespace sd::io {

struct TensorEntry {
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets inside the data section
  uint64_t end = 0;
};

// An opened, validated safetensors file. Tensors are read on demand.
class SafeTensorsFile : public TensorFile {
 public:
  explicit SafeTensorsFile(std::filesystem::path path);

  const std::filesystem::path& path() const { return file_.path(); }
  std::string label() const override { return path().string(); }
  const std::map<std::string, std::string>& metadata() const override { return metadata_; }
  // Tensor names in data order.
  const std::vector<std::string>& names() const override { return names_; }
  bool contains(const std::string& name) const override { return entries_.count(name) > 0; }
  const TensorEntry& entry(const std::string& name) const;
  TensorInfo info(const std::string& name) const override;
  // One tensor in its stored dtype, its own memory. From kMappedBytes up (and aligned to its element size) that is a
  // copy-on-write mapping of its bytes (RandomAccessFile::map: no copy, no cleared pages, read again from the file
  // if the kernel needs the memory); smaller tensors are copied, so a dataset of small files kept in memory does not
  // hold a mapping per tensor (Linux allows 65530 per process).
  at::Tensor read(const std::string& name) const override;
  static constexpr uint64_t kMappedBytes = 1 << 20;

 private:
  RandomAccessFile file_;
  uint64_t data_start_ = 0;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, TensorEntry> entries_;
  std::vector<std::string> names_;
};

using TensorMap = std::map<std::string, at::Tensor>;

// Reads every tensor of a file in its stored dtype.
TensorMap load_safetensors(const std::filesystem::path& path);

// Writes tensors (made contiguous, on CPU) atomically. Tensors are laid out the way the safetensors
// reference writer does: by dtype alignment (largest first), then by name; the header is padded to 8 bytes.
void save_safetensors(const std::filesystem::path& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// "F32" <-> at::kFloat, ...; an unknown name throws sd::Error.
at::ScalarType dtype_from_safetensors(const std::string& name);
std::string dtype_to_safetensors(at::ScalarType dtype);

}  // namespace sd::io
