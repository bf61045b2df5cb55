#include "data/webdataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "core/text.h"
#include "data/listing_fingerprint.h"
#include "data/prefetcher.h"
#include "io/tar_reader.h"

namespace sd::data {

namespace fs = std::filesystem;

std::optional<std::pair<std::string, std::string>> split_sample_key(const std::string& member_name) {
  const size_t slash = member_name.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  const size_t dot = member_name.find('.', base);
  if (dot == std::string::npos || dot == base) return std::nullopt;
  return std::make_pair(member_name.substr(0, dot), member_name.substr(dot + 1));
}

namespace {

using Members = std::map<std::string, io::TarEntry>;  // a sample's members by extension

const io::TarEntry* first_of(const Members& members, std::initializer_list<const char*> extensions) {
  for (const char* extension : extensions) {
    auto it = members.find(extension);
    if (it != members.end()) return &it->second;
  }
  return nullptr;
}

// Adds the sample `key` to the index if it has an image and a caption.
void add_sample(const std::string& key, const Members& members, const fs::path& path, uint32_t shard,
                ShardIndex& index) {
  const io::TarEntry* image = first_of(members, {"jpg", "jpeg", "png", "webp", "bmp"});
  const io::TarEntry* caption = first_of(members, {"txt", "json"});
  if (!image || !caption) {
    if (index.incomplete++ == 0) index.incomplete_example = fmt::format("{}: '{}'", path.string(), key);
    return;
  }
  if (image->size > UINT32_MAX || caption->size > UINT32_MAX) {
    index.warnings.push_back(fmt::format("{}: sample '{}' has a member of 4 GiB or more; skipped", path.string(), key));
    return;
  }
  index.samples.push_back({image->data_offset, caption->data_offset, static_cast<uint32_t>(image->size),
                           static_cast<uint32_t>(caption->size), shard, members.count("txt") == 0});
}

// The member name in the ustar header block `header`: its prefix field, a slash and its name field.
std::string ustar_member_name(const std::string& header) {
  auto field = [&](size_t at, size_t size) {
    const std::string text = header.substr(at, size);
    return text.substr(0, text.find('\0'));
  };
  const std::string prefix = header.compare(257, 5, "ustar") == 0 ? field(345, 155) : "";
  return prefix.empty() ? field(0, 100) : prefix + "/" + field(0, 100);
}

}  // namespace

ShardIndex index_shard(const fs::path& path, uint32_t shard) {
  io::TarReader tar(path);
  ShardIndex index;
  std::optional<std::string> key;  // of the sample being gathered
  Members members;
  while (std::optional<io::TarEntry> entry = tar.next()) {
    auto split = split_sample_key(entry->name);
    if (!split) {
      index.warnings.push_back(fmt::format("{}: member '{}' has no extension, so belongs to no sample; skipped",
                                           path.string(), entry->name));
      continue;
    }
    auto& [member_key, extension] = *split;
    // WebDataset lower-cases extensions, so "IMG.JPG" and "img.jpg" name the same kind of file.
    extension = lowercase(extension);
    if (member_key != key) {
      if (key) add_sample(*key, members, path, shard, index);
      key = member_key;
      members.clear();
    }
    if (!members.emplace(extension, *entry).second)
      index.warnings.push_back(fmt::format("{}: sample '{}' has two '{}' files; the second is skipped", path.string(),
                                           member_key, extension));
  }
  if (key) add_sample(*key, members, path, shard, index);
  index.warnings.insert(index.warnings.end(), tar.warnings().begin(), tar.warnings().end());
  return index;
}

WebDatasetShards::WebDatasetShards(std::vector<fs::path> shards, std::string caption_key, int threads)
    : shards_(std::move(shards)), caption_key_(std::move(caption_key)) {
  SD_CHECK(shards_.size() <= UINT32_MAX, "--train_shards: {} shards; at most {} are supported", shards_.size(),
           UINT32_MAX);
  Prefetcher<ShardIndex> indexers(threads);
  for (size_t s = 0; s < shards_.size(); ++s)
    indexers.request([this, s] { return index_shard(shards_[s], static_cast<uint32_t>(s)); });
  int64_t incomplete = 0;
  std::string example;
  double ignored = 0;
  while (indexers.pending() > 0) {
    ShardIndex index = indexers.next(ignored);
    samples_.insert(samples_.end(), index.samples.begin(), index.samples.end());
    for (const std::string& warning : index.warnings) log::warn("{}", warning);
    if (incomplete == 0) example = index.incomplete_example;
    incomplete += index.incomplete;
  }
  if (incomplete > 0)
    log::warn(
        "--train_shards: {} sample(s) without an image (jpg, jpeg, png, webp, bmp) or a caption (txt, json) "
        "were dropped, e.g. {}",
        incomplete, example);
  // The usual cause with real files: a tar written in directory order, which splits a sample's members apart.
  SD_CHECK(!samples_.empty(),
           "--train_shards: the {} shard(s) hold no sample with both an image and a caption (a sample's members must "
           "follow each other in the tar, as `tar --sort=name` and img2dataset write them)",
           shards_.size());
}

EncodedSample WebDatasetShards::read(int64_t index) const {
  const ShardSample& sample = samples_.at(index);
  const std::string caption = read_member(index, "caption", sample.caption_offset, sample.caption_size);
  return {read_member(index, "image", sample.image_offset, sample.image_size), captions_of(index, caption)};
}

std::string WebDatasetShards::image_head(int64_t index, uint64_t bytes) const {
  const ShardSample& sample = samples_.at(index);
  return read_member(index, "image", sample.image_offset, std::min<uint64_t>(bytes, sample.image_size));
}

std::string WebDatasetShards::read_member(int64_t index, const char* what, uint64_t offset, uint64_t size) const {
  const fs::path& shard = shards_[samples_.at(index).shard];
  try {
    return io::read_entry(shard, {what, offset, size});
  } catch (const Error&) {
    if (!fs::exists(shard)) throw;  // read_entry's message says the archive is gone
    // A shard that shrank is named by its sample, which read_entry cannot do: the index keeps offsets, not names.
    fail("{}: its {} ({} bytes at offset {}) can no longer be read; was the shard changed since it was indexed?",
         describe(index), what, size, offset);
  }
}

std::string WebDatasetShards::describe(int64_t index) const {
  const ShardSample& sample = samples_.at(index);
  const fs::path& shard = shards_[sample.shard];
  // The index keeps offsets, not keys (32 bytes a sample); a message reads the image's header block for its key.
  constexpr uint64_t kBlock = 512;
  try {
    const std::string header = io::read_entry(shard, {"header", sample.image_offset - kBlock, kBlock});
    if (const auto key_and_extension = split_sample_key(ustar_member_name(header)))
      return fmt::format("{}: sample '{}'", shard.string(), key_and_extension->first);
  } catch (const Error&) {
    // The shard changed since indexing; the offset still names the sample.
  }
  return fmt::format("{} (the sample whose image starts at byte {})", shard.string(), sample.image_offset);
}

// A .txt caption, or the caption in a .json: a string, or a list of strings of which each use picks one (as an
// imagefolder caption column may be).
std::vector<std::string> WebDatasetShards::captions_of(int64_t index, const std::string& bytes) const {
  if (!samples_.at(index).caption_is_json) return {bytes};
  const nlohmann::json metadata = nlohmann::json::parse(bytes, nullptr, /*allow_exceptions=*/false);
  if (metadata.is_discarded()) throw UnusableSample(fmt::format("{}: its .json is not valid JSON", describe(index)));
  for (const std::string& key : {caption_key_, std::string("caption")}) {
    if (!metadata.is_object() || !metadata.contains(key)) continue;
    const nlohmann::json& value = metadata[key];
    if (value.is_string()) return {value.get<std::string>()};
    if (value.is_array() && !value.empty() &&
        std::all_of(value.begin(), value.end(), [](const nlohmann::json& v) { return v.is_string(); }))
      return value.get<std::vector<std::string>>();
  }
  throw UnusableSample(
      fmt::format("{}: no .txt caption, and its .json has no '{}' or 'caption' that is a string or a "
                  "list of strings",
                  describe(index), caption_key_));
}

std::string WebDatasetShards::fingerprint() const {
  return text_fingerprint({listing_fingerprint(shards_), std::to_string(samples_.size())});
}

}  // namespace sd::data
