// A torch.save file (diffusers' .bin, transformers' pytorch_model.bin, a Lightning .ckpt) as named tensors: a zip
// archive whose data.pkl, read with the restricted unpickler, describes each tensor as a view into one of the
// archive's data/<key> storages. Only the views are kept; tensor data is read when asked for.
#pragma once
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "io/tensor_file.h"
#include "io/torch_pickle.h"
#include "io/zip_archive.h"

namespace sd::io {

class TorchFile : public TensorFile {
 public:
  // Reads the pickle. The state dict is the top-level dict, or its "state_dict" entry (Lightning checkpoints);
  // tensors in nested dicts are named "outer.inner". Scalar entries of the top-level dict (global_step, name)
  // become metadata().
  explicit TorchFile(std::filesystem::path path);

  std::string label() const override { return zip_.path().string(); }
  const std::vector<std::string>& names() const override { return names_; }
  bool contains(const std::string& name) const override { return views_.count(name) > 0; }
  TensorInfo info(const std::string& name) const override;
  at::Tensor read(const std::string& name) const override;
  const std::map<std::string, std::string>& metadata() const override { return metadata_; }

 private:
  const TorchTensorView& view(const std::string& name) const;
  const ZipArchive::Entry& storage_entry(const std::string& key) const;
  void collect(const PickleValue& root);
  void add_tensors(const PickleValue& dict, const std::string& prefix, int depth, std::set<const PickleValue*>& walked);

  ZipArchive zip_;
  std::string prefix_;  // torch.save puts every record under one folder ("archive/", or the file's stem)
  std::map<std::string, TorchTensorView> views_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace sd::io
