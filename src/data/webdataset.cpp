#include "data/webdataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

namespace sd::data {

std::optional<std::pair<std::string, std::string>> split_sample_key(const std::string& member_name) {
  const size_t slash = member_name.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  const size_t dot = member_name.find('.', base);
  if (dot == std::string::npos || dot == base) return std::nullopt;
  return std::make_pair(member_name.substr(0, dot), member_name.substr(dot + 1));
}

std::optional<std::pair<std::string, const std::string*>> find_image(const WebDatasetSample& sample) {
  for (const char* extension : {"jpg", "jpeg", "png", "webp"}) {
    auto it = sample.files.find(extension);
    if (it != sample.files.end()) return std::make_pair(it->first, &it->second);
  }
  return std::nullopt;
}

WebDatasetReader::WebDatasetReader(const std::filesystem::path& shard) : tar_(shard) {}

std::optional<WebDatasetSample> WebDatasetReader::next() {
  while (std::optional<io::TarMember> member = tar_.next()) {
    auto split = split_sample_key(member->name);
    if (!split) {
      warnings_.push_back(fmt::format("{}: member '{}' has no extension, so belongs to no sample; skipped",
                                      tar_.path().string(), member->name));
      continue;
    }
    auto& [key, extension] = *split;
    // WebDataset lower-cases extensions, so "IMG.JPG" and "img.jpg" name the same kind of file.
    std::transform(extension.begin(), extension.end(), extension.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    std::optional<WebDatasetSample> finished;
    if (pending_ && pending_->key != key) finished = std::exchange(pending_, std::nullopt);
    if (!pending_) pending_ = WebDatasetSample{key, {}, tar_.path()};
    if (!pending_->files.emplace(extension, std::move(member->data)).second)
      warnings_.push_back(fmt::format("{}: sample '{}' has two '{}' files; the second is skipped", tar_.path().string(),
                                      key, extension));
    if (finished) return finished;
  }
  return std::exchange(pending_, std::nullopt);
}

std::vector<std::string> WebDatasetReader::warnings() const {
  std::vector<std::string> all = tar_.warnings();
  all.insert(all.end(), warnings_.begin(), warnings_.end());
  return all;
}

}  // namespace sd::data
