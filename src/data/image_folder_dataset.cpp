#include "data/image_folder_dataset.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "core/text.h"
#include "io/atomic_file.h"

namespace sd::data {

namespace fs = std::filesystem;
using nlohmann::json;

bool is_image_path(const fs::path& path) {
  const std::string ext = lowercase(path.extension().string());
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png" || ext == ".bmp" || ext == ".webp";
}

namespace {

std::vector<fs::path> files_under(const fs::path& dir, const fs::path& skip_dir) {
  std::vector<fs::path> files;
  std::error_code ignored;
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator(); ++it) {
    if (!skip_dir.empty() && it->is_directory() && fs::equivalent(it->path(), skip_dir, ignored)) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file()) files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<std::string> captions_of(const json& value, const std::string& where) {
  if (value.is_string()) return {value.get<std::string>()};
  if (value.is_array() && !value.empty() &&
      std::all_of(value.begin(), value.end(), [](const json& v) { return v.is_string(); }))
    return value.get<std::vector<std::string>>();
  fail("{}: the caption column should contain either strings or lists of strings", where);
}

// One metadata.jsonl: its lines become samples of images in the same folder tree.
void read_metadata(const fs::path& metadata, const ImageFolderOptions& o, std::vector<CaptionedImage>& samples) {
  const std::string image_key = o.image_column == "image" ? "file_name" : o.image_column;
  std::istringstream in(io::read_text_file(metadata));
  int line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{} line {}", metadata.string(), line_number);
    const json row = json::parse(line, nullptr, /*allow_exceptions=*/false);
    SD_CHECK(row.is_object(), "{}: not a JSON object", where);
    SD_CHECK(row.contains(image_key) && row[image_key].is_string(),
             "{}: no '{}' (--image_column {}); the columns are {}", where, image_key, o.image_column, row.dump());
    SD_CHECK(row.contains(o.caption_column), "{}: no caption column '{}' (--caption_column); the columns are {}", where,
             o.caption_column, row.dump());
    const fs::path image = metadata.parent_path() / row[image_key].get<std::string>();
    SD_CHECK(fs::is_regular_file(image), "{}: image {} not found", where, image.string());
    samples.push_back({image, captions_of(row[o.caption_column], where)});
  }
}

// A kohya caption file's text (its first line, trimmed), or "" when the image has none.
std::string kohya_caption(const fs::path& image, int64_t& missing) {
  for (const char* ext : {".txt", ".caption"}) {
    fs::path path = image;
    path.replace_extension(ext);
    if (!fs::is_regular_file(path)) continue;
    std::string text = io::read_text_file(path);
    text = text.substr(0, text.find('\n'));
    const auto first = text.find_first_not_of(" \t\r"), last = text.find_last_not_of(" \t\r");
    return first == std::string::npos ? "" : text.substr(first, last - first + 1);
  }
  ++missing;
  return "";
}

}  // namespace

ImageFolderDataset::ImageFolderDataset(const ImageFolderOptions& o) {
  SD_CHECK(fs::is_directory(o.data_dir), "--train_data_dir {}: not a directory", o.data_dir.string());
  const std::vector<fs::path> files = files_under(o.data_dir, o.skip_dir);
  std::vector<fs::path> metadata;
  for (const auto& f : files)
    if (f.filename() == "metadata.jsonl") metadata.push_back(f);
  if (!metadata.empty()) {
    layout_ = "imagefolder";
    for (const auto& m : metadata) read_metadata(m, o, samples_);
  } else {
    layout_ = "kohya";
    int64_t missing = 0;
    for (const auto& f : files)
      if (is_image_path(f)) samples_.push_back({f, {kohya_caption(f, missing)}});
    if (missing > 0)
      log::warn(
          "--train_data_dir {}: {} image(s) have no caption file (.txt or .caption) and train with an empty "
          "caption",
          o.data_dir.string(), missing);
  }
  SD_CHECK(!samples_.empty(),
           "--train_data_dir {}: no training images (expected images with a metadata.jsonl, the Hugging Face "
           "imagefolder layout, or images with .txt captions beside them)",
           o.data_dir.string());
}

EncodedSample ImageFolderDataset::read(int64_t index) const {
  const CaptionedImage& sample = samples_.at(index);
  return {io::read_text_file(sample.image), sample.captions};
}

std::string ImageFolderDataset::image_head(int64_t index, uint64_t bytes) const {
  std::ifstream file(samples_.at(index).image, std::ios::binary);
  SD_CHECK(file.is_open(), "{}: cannot open the image file", samples_.at(index).image.string());
  std::string head(bytes, '\0');
  file.read(head.data(), static_cast<std::streamsize>(bytes));
  head.resize(static_cast<size_t>(file.gcount()));
  return head;
}

}  // namespace sd::data
