#include "io/tensor_file.h"

#include <algorithm>
#include <atomic>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/parallel.h"
#include "io/atomic_file.h"
#include "io/random_access_file.h"
#include "io/safetensors.h"
#include "io/torch_file.h"

namespace sd::io {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A checkpoint split into shards (transformers' and diffusers' *.index.json): {"weight_map": {tensor: shard file}}.
class ShardedTensorFile : public TensorFile {
 public:
  explicit ShardedTensorFile(const fs::path& index) : index_(index) {
    nlohmann::json root;
    try {
      root = nlohmann::json::parse(read_text_file(index));
    } catch (const nlohmann::json::exception& e) {
      fail("{}: not valid JSON ({})", index.string(), e.what());
    }
    SD_CHECK(root.is_object() && root.contains("weight_map") && root["weight_map"].is_object(),
             "{}: a sharded checkpoint index needs a \"weight_map\" object {{tensor name: shard file}}",
             index.string());
    for (const auto& [name, shard] : root["weight_map"].items()) {
      SD_CHECK(shard.is_string(), "{}: weight_map['{}'] must be a file name", index.string(), name);
      shard_of_[name] = &open_shard(shard.get<std::string>());
      names_.push_back(name);
    }
    SD_CHECK(!names_.empty(), "{}: the weight_map is empty", index.string());
    for (const auto& [name, shard] : shard_of_)
      SD_CHECK(shard->contains(name), "{}: weight_map puts '{}' in {}, which does not hold it", index.string(), name,
               shard->label());
    if (root.contains("metadata") && root["metadata"].is_object())
      for (const auto& [key, value] : root["metadata"].items())
        metadata_[key] = value.is_string() ? value.get<std::string>() : value.dump();
  }

  std::string label() const override { return index_.string(); }
  const std::vector<std::string>& names() const override { return names_; }
  bool contains(const std::string& name) const override { return shard_of_.count(name) > 0; }
  TensorInfo info(const std::string& name) const override { return shard(name).info(name); }
  at::Tensor read(const std::string& name) const override { return shard(name).read(name); }
  const std::map<std::string, std::string>& metadata() const override { return metadata_; }

 private:
  // Shards are plain file names beside the index; a path elsewhere is refused rather than followed.
  const TensorFile& open_shard(const std::string& file) {
    SD_CHECK(!file.empty() && file.find('/') == std::string::npos && file != "." && file != ".." &&
                 !ends_with(file, ".json"),
             "{}: shard '{}' must be a weights file name in the index's folder", index_.string(), file);
    auto it = shards_.find(file);
    if (it == shards_.end()) it = shards_.emplace(file, open_tensor_file(index_.parent_path() / file)).first;
    return *it->second;
  }

  const TensorFile& shard(const std::string& name) const {
    auto it = shard_of_.find(name);
    SD_CHECK(it != shard_of_.end(), "{}: no tensor named '{}'", label(), name);
    return *it->second;
  }

  fs::path index_;
  std::map<std::string, std::unique_ptr<TensorFile>> shards_;
  std::map<std::string, const TensorFile*> shard_of_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

// Values whose exponent bits are all ones (infinities and NaNs), of the bit patterns x[0, n).
template <typename Bits>
int64_t count_all_ones_exponents(const Bits* x, int64_t n, Bits exponent) {
  std::atomic<int64_t> total{0};
  sd::parallel_for(0, n, int64_t{1} << 16, [&](int64_t begin, int64_t end) {
    int64_t count = 0;
    for (int64_t i = begin; i < end; ++i) count += (x[i] & exponent) == exponent;
    total += count;
  });
  return total;
}

}  // namespace

int64_t count_nonfinite(const at::Tensor& tensor) {
  if (!tensor.is_floating_point() || tensor.numel() == 0) return 0;
  const at::Tensor t = tensor.contiguous();
  const void* data = t.data_ptr();
  switch (t.scalar_type()) {
    case at::kFloat:
      return count_all_ones_exponents(static_cast<const uint32_t*>(data), t.numel(), uint32_t{0x7f800000});
    case at::kDouble:
      return count_all_ones_exponents(static_cast<const uint64_t*>(data), t.numel(), uint64_t{0x7ff0000000000000});
    case at::kBFloat16:
      return count_all_ones_exponents(static_cast<const uint16_t*>(data), t.numel(), uint16_t{0x7f80});
    case at::kHalf: return count_all_ones_exponents(static_cast<const uint16_t*>(data), t.numel(), uint16_t{0x7c00});
    default: return t.numel() - at::isfinite(t).sum().item<int64_t>();
  }
}

void check_finite(const at::Tensor& tensor, const std::string& label, const std::string& name) {
  const int64_t bad = count_nonfinite(tensor);
  SD_CHECK(bad == 0,
           "{}: tensor '{}' holds {} NaN or infinite values (of {}): the weights are damaged or come from a "
           "diverged run",
           label, name, bad, tensor.numel());
}

std::unique_ptr<TensorFile> open_tensor_file(const fs::path& path) {
  if (ends_with(path.filename().string(), ".json")) return std::make_unique<ShardedTensorFile>(path);
  const RandomAccessFile file(path);
  const std::string start = file.read(std::min<uint64_t>(file.size(), 9), 0);
  if (start.rfind("PK", 0) == 0) return std::make_unique<TorchFile>(path);
  // A safetensors file: an 8-byte header length, then the JSON header. Its length's low byte may be anything,
  // 0x80 included, so that is checked first.
  const bool safetensors = start.size() == 9 && start[8] == '{';
  // Before PyTorch 1.6, torch.save wrote a bare pickle (which starts with the PROTO opcode 0x80).
  SD_CHECK(safetensors || start.empty() || start[0] != '\x80',
           "{}: a torch.save file in the legacy pre-1.6 format, which sdtrain does not read; re-save it with a current "
           "PyTorch (torch.save(torch.load(f), f))",
           path.string());
  return std::make_unique<SafeTensorsFile>(path);
}

}  // namespace sd::io
