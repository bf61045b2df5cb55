#include "io/torch_file.h"

#include "core/error.h"

namespace sd::io {

namespace {

using Kind = PickleValue::Kind;

constexpr int kMaxNesting = 8;

const PickleValue* dict_entry(const PickleValue& dict, const std::string& key) {
  for (const auto& [k, v] : dict.entries)
    if (k->kind == Kind::kString && k->text == key) return v.get();
  return nullptr;
}

// A scalar entry as text, or "" for anything else.
std::string scalar_text(const PickleValue& value) {
  switch (value.kind) {
    case Kind::kString: return value.text;
    case Kind::kInt: return std::to_string(value.integer);
    case Kind::kFloat: return fmt::format("{}", value.real);
    default: return "";
  }
}

}  // namespace

TorchFile::TorchFile(std::filesystem::path path) : zip_(std::move(path)) {
  SD_CHECK(!zip_.entries().empty(), "{}: empty zip archive, not a torch.save file", label());
  const std::string& first = zip_.entries().front().name;
  prefix_ = first.substr(0, first.find('/') + 1);
  const ZipArchive::Entry* pickle = zip_.find(prefix_ + "data.pkl");
  SD_CHECK(pickle, "{}: not a torch.save archive (no {}data.pkl)", label(), prefix_);
  if (const ZipArchive::Entry* order = zip_.find(prefix_ + "byteorder"))
    SD_CHECK(zip_.read(*order) == "little", "{}: tensors stored big-endian are not supported", label());
  const std::string bytes = zip_.read(*pickle);
  const PickleRef root =
      unpickle_torch(bytes, label(), [this](const std::string& key) { return storage_entry(key).size; });
  collect(*root);
}

void TorchFile::collect(const PickleValue& root) {
  SD_CHECK(root.kind == Kind::kDict, "{}: holds no state dict (the pickle is not a dict)", label());
  // Scalars beside the tensors: a Lightning checkpoint's global_step, an A1111 embedding's name.
  for (const auto& [k, v] : root.entries)
    if (k->kind == Kind::kString && !scalar_text(*v).empty()) metadata_[k->text] = scalar_text(*v);
  const PickleValue* state = dict_entry(root, "state_dict");
  std::set<const PickleValue*> walked;
  add_tensors(state && state->kind == Kind::kDict ? *state : root, "", 0, walked);
  SD_CHECK(!views_.empty(), "{}: holds no tensors (expected a state dict of name -> tensor)", label());
}

// Tensors in nested dicts are named by their keys joined with '.', as safetensors files flatten them (A1111's
// {"string_to_param": {"*": t}} becomes "string_to_param.*"). A forged pickle can nest dicts without end or put one
// dict in many places (even inside itself, through the memo): the depth is bounded and each dict is walked once, so
// the walk stays linear in the pickle's size.
void TorchFile::add_tensors(const PickleValue& dict, const std::string& prefix, int depth,
                            std::set<const PickleValue*>& walked) {
  SD_CHECK(depth < kMaxNesting, "{}: dicts nested more than {} deep, not a state dict", label(), kMaxNesting);
  if (!walked.insert(&dict).second) return;
  for (const auto& [k, v] : dict.entries) {
    if (k->kind != Kind::kString) continue;
    const std::string name = prefix + k->text;
    if (v->kind == Kind::kDict) add_tensors(*v, name + ".", depth + 1, walked);
    if (v->kind == Kind::kTensor && views_.insert_or_assign(name, v->tensor).second) names_.push_back(name);
  }
}

const ZipArchive::Entry& TorchFile::storage_entry(const std::string& key) const {
  const ZipArchive::Entry* entry = zip_.find(prefix_ + "data/" + key);
  SD_CHECK(entry, "{}: the pickle refers to storage '{}' but the archive has no {}data/{}", label(), key, prefix_, key);
  return *entry;
}

const TorchTensorView& TorchFile::view(const std::string& name) const {
  auto it = views_.find(name);
  SD_CHECK(it != views_.end(), "{}: no tensor named '{}'", label(), name);
  return it->second;
}

TensorInfo TorchFile::info(const std::string& name) const {
  const TorchTensorView& v = view(name);
  return {v.storage.dtype, v.size};
}

// Reads only the part of the storage the view spans, then lays it out as the view says.
at::Tensor TorchFile::read(const std::string& name) const {
  const TorchTensorView& v = view(name);
  const int64_t span = v.span().value();  // checked against the storage when the pickle was read
  const auto element_size = static_cast<uint64_t>(c10::elementSize(v.storage.dtype));
  at::Tensor spanned = at::empty({span}, at::TensorOptions().dtype(v.storage.dtype));
  zip_.read(storage_entry(v.storage.key), static_cast<uint64_t>(v.offset) * element_size,
            static_cast<uint64_t>(span) * element_size, spanned.data_ptr());
  return spanned.as_strided(v.size, v.stride).contiguous();
}

}  // namespace sd::io
