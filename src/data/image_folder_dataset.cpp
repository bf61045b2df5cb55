#include "data/image_folder_dataset.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "core/text.h"
#include "data/listing_fingerprint.h"
#include "io/atomic_file.h"
#include "io/csv.h"

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

// One metadata row (a JSON object) as a sample of an image in the metadata file's folder tree.
CaptionedImage metadata_sample(const json& row, const fs::path& metadata, const std::string& where,
                               const ImageFolderOptions& o) {
  const std::string image_key = o.image_column == "image" ? "file_name" : o.image_column;
  SD_CHECK(row.contains(image_key) && row[image_key].is_string(), "{}: no '{}' (--image_column {}); the columns are {}",
           where, image_key, o.image_column, row.dump());
  SD_CHECK(row.contains(o.caption_column), "{}: no caption column '{}' (--caption_column); the columns are {}", where,
           o.caption_column, row.dump());
  const fs::path image = metadata.parent_path() / row[image_key].get<std::string>();
  SD_CHECK(fs::is_regular_file(image), "{}: image {} not found", where, image.string());
  return {image, captions_of(row[o.caption_column], where)};
}

// metadata.jsonl: one JSON object per line.
void read_metadata_jsonl(const fs::path& metadata, const ImageFolderOptions& o, std::vector<CaptionedImage>& samples) {
  std::istringstream in(io::read_text_file(metadata));
  int line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{} line {}", metadata.string(), line_number);
    const json row = json::parse(line, nullptr, /*allow_exceptions=*/false);
    SD_CHECK(row.is_object(), "{}: not a JSON object", where);
    samples.push_back(metadata_sample(row, metadata, where, o));
  }
}

// metadata.csv: a header row naming the columns, then one row per image; every value is text (RFC 4180 quoting).
void read_metadata_csv(const fs::path& metadata, const ImageFolderOptions& o, std::vector<CaptionedImage>& samples) {
  const std::vector<io::CsvRow> rows = io::parse_csv(io::read_text_file(metadata), metadata.string());
  if (rows.empty()) return;
  const std::vector<std::string>& header = rows.front().fields;
  for (size_t r = 1; r < rows.size(); ++r) {
    const std::string where = fmt::format("{} line {}", metadata.string(), rows[r].line);
    SD_CHECK(rows[r].fields.size() == header.size(), "{}: {} values, but the header names {} columns", where,
             rows[r].fields.size(), header.size());
    json row = json::object();
    for (size_t c = 0; c < header.size(); ++c) row[header[c]] = rows[r].fields[c];
    samples.push_back(metadata_sample(row, metadata, where, o));
  }
}

bool is_metadata_file(const fs::path& path) {
  return path.filename() == "metadata.jsonl" || path.filename() == "metadata.csv";
}

// kohya's DreamBooth folders: "10_cat" repeats its images 10 times, and "cat" captions those without a caption file.
struct KohyaFolder {
  int64_t repeats = 1;
  std::string class_tokens;
};

std::optional<KohyaFolder> kohya_folder(const std::string& name) {
  const size_t underscore = name.find('_');
  const std::string count = name.substr(0, underscore);
  if (count.empty() || count.size() > 6 || !std::all_of(count.begin(), count.end(), ::isdigit)) return std::nullopt;
  return KohyaFolder{std::stoll(count), underscore == std::string::npos ? "" : name.substr(underscore + 1)};
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

// An image and how many times an epoch holds it.
struct RepeatedImage {
  CaptionedImage sample;
  int64_t repeats = 1;
};

// Images with caption files beside them; those in a top-level "N_tokens" folder N times each, as kohya's
// DreamBooth datasets, with "tokens" as the caption of those without a caption file. `flag` names the folder in
// messages.
std::vector<RepeatedImage> list_kohya(const fs::path& dir, const std::vector<fs::path>& files,
                                      const std::string& flag) {
  std::vector<RepeatedImage> images;
  int64_t missing = 0;
  std::map<std::string, int64_t> repeated;  // folder -> images in it
  for (const auto& f : files) {
    if (!is_image_path(f)) continue;
    const fs::path relative = f.lexically_relative(dir);
    const std::string top = relative.begin()->string();
    const bool in_a_folder = std::next(relative.begin()) != relative.end();
    const std::optional<KohyaFolder> folder = in_a_folder ? kohya_folder(top) : std::nullopt;
    if (folder) ++repeated[top];
    if (folder && folder->repeats == 0) continue;  // kohya skips such a folder
    int64_t no_caption_file = 0;
    std::string caption = kohya_caption(f, no_caption_file);
    if (no_caption_file && folder && !folder->class_tokens.empty())
      caption = folder->class_tokens;
    else
      missing += no_caption_file;
    images.push_back({{f, {caption}}, folder ? folder->repeats : 1});
  }
  for (const auto& [name, count] : repeated) {
    const int64_t repeats = kohya_folder(name)->repeats;
    if (repeats == 0)
      log::warn("{} {}: {} image(s) in {} are skipped (0 repeats, as kohya does)", flag, dir.string(), count, name);
    else
      log::info("{} {}: {} image(s) in {}, each {} time(s) per epoch", flag, dir.string(), count, name, repeats);
  }
  if (missing > 0)
    log::warn("{} {}: {} image(s) have no caption file (.txt or .caption) and train with an empty caption", flag,
              dir.string(), missing);
  return images;
}

int64_t total_repeats(const std::vector<RepeatedImage>& images) {
  int64_t total = 0;
  for (const RepeatedImage& image : images) total += image.repeats;
  return total;
}

// kohya's DreamBoothDataset: regularization images are taken in order, each with its repeats, until they make as
// many samples as the training images (the rest are not used); if all of them make fewer, one more repeat each, in
// order, until they do. An epoch then holds as many regularization samples as training samples.
std::vector<RepeatedImage> balance_regularization(std::vector<RepeatedImage> reg, int64_t train_samples) {
  std::vector<RepeatedImage> used;
  int64_t n = 0;
  for (RepeatedImage& image : reg) {
    if (n >= train_samples) break;
    n += image.repeats;
    used.push_back(std::move(image));
  }
  for (size_t i = 0; n < train_samples; i = (i + 1) % used.size(), ++n) ++used[i].repeats;
  return used;
}

void append_repeated(const std::vector<RepeatedImage>& images, std::vector<CaptionedImage>& samples) {
  for (const RepeatedImage& image : images)
    for (int64_t k = 0; k < image.repeats; ++k) samples.push_back(image.sample);
}

// Whether folder `inner` is `outer` or lies inside it (both existing).
bool is_within(const fs::path& inner, const fs::path& outer) {
  const fs::path a = fs::canonical(inner), b = fs::canonical(outer);
  return std::mismatch(b.begin(), b.end(), a.begin(), a.end()).first == b.end();
}

// The regularization images of `o.reg_data_dir`, with the prior loss weight.
std::vector<RepeatedImage> list_regularization(const ImageFolderOptions& o) {
  std::vector<RepeatedImage> reg =
      list_kohya(o.reg_data_dir, files_under(o.reg_data_dir, o.skip_dir), "--reg_data_dir");
  SD_CHECK(!reg.empty(), "--reg_data_dir {}: no images", o.reg_data_dir.string());
  for (RepeatedImage& image : reg) {
    image.sample.loss_weight = o.prior_loss_weight;
    image.sample.regularization = true;
  }
  return reg;
}

// The regularization images `reg` balanced against `train_samples`.
std::vector<RepeatedImage> balanced_regularization(const ImageFolderOptions& o, std::vector<RepeatedImage> reg,
                                                   int64_t train_samples) {
  const size_t listed = reg.size();
  std::vector<RepeatedImage> used = balance_regularization(std::move(reg), train_samples);
  if (used.size() < listed)
    log::warn(
        "--reg_data_dir {}: {} of {} image(s) are not used: the others already make {} samples, as many as the "
        "training images (kohya's balance)",
        o.reg_data_dir.string(), listed - used.size(), listed, total_repeats(used));
  log::info("--reg_data_dir {}: {} image(s) make {} regularization samples per epoch, loss weight {}",
            o.reg_data_dir.string(), used.size(), total_repeats(used), o.prior_loss_weight);
  return used;
}

}  // namespace

ImageFolderDataset::ImageFolderDataset(const ImageFolderOptions& o) {
  SD_CHECK(fs::is_directory(o.data_dir), "--train_data_dir {}: not a directory", o.data_dir.string());
  if (!o.reg_data_dir.empty()) {
    SD_CHECK(fs::is_directory(o.reg_data_dir), "--reg_data_dir {}: not a directory", o.reg_data_dir.string());
    SD_CHECK(!is_within(o.reg_data_dir, o.data_dir) && !is_within(o.data_dir, o.reg_data_dir),
             "--reg_data_dir {} and --train_data_dir {} overlap: the regularization images would also train as "
             "training images; keep the two folders apart",
             o.reg_data_dir.string(), o.data_dir.string());
  }
  const std::vector<fs::path> files = files_under(o.data_dir, o.skip_dir);
  std::vector<fs::path> metadata;
  for (const auto& f : files)
    if (is_metadata_file(f)) metadata.push_back(f);
  if (!metadata.empty()) {
    layout_ = "imagefolder";
    for (const auto& m : metadata) {
      SD_CHECK(!(m.extension() == ".csv" && fs::exists(fs::path(m).replace_extension(".jsonl"))),
               "{}: holds both metadata.jsonl and metadata.csv; keep one", m.parent_path().string());
      if (m.extension() == ".csv")
        read_metadata_csv(m, o, samples_);
      else
        read_metadata_jsonl(m, o, samples_);
    }
  } else {
    layout_ = "kohya";
    append_repeated(list_kohya(o.data_dir, files, "--train_data_dir"), samples_);
  }
  SD_CHECK(!samples_.empty(),
           "--train_data_dir {}: no training images (expected images with a metadata.jsonl or metadata.csv, the "
           "Hugging Face imagefolder layout, or images with .txt captions beside them)",
           o.data_dir.string());
  if (!o.reg_data_dir.empty()) {
    std::vector<RepeatedImage> reg = list_regularization(o);
    regularization_listed_ = total_repeats(reg);
    append_repeated(balanced_regularization(o, std::move(reg), static_cast<int64_t>(samples_.size())), samples_);
  }
}

SampleCounts ImageFolderDataset::sample_counts() const {
  const auto training =
      std::count_if(samples_.begin(), samples_.end(), [](const auto& s) { return !s.regularization; });
  return {static_cast<int64_t>(training), regularization_listed_};
}

EncodedSample ImageFolderDataset::read(int64_t index) const {
  const CaptionedImage& sample = samples_.at(index);
  return {io::read_text_file(sample.image), sample.captions, sample.loss_weight};
}

std::string ImageFolderDataset::image_head(int64_t index, uint64_t bytes) const {
  std::ifstream file(samples_.at(index).image, std::ios::binary);
  SD_CHECK(file.is_open(), "{}: cannot open the image file", samples_.at(index).image.string());
  std::string head(bytes, '\0');
  file.read(head.data(), static_cast<std::streamsize>(bytes));
  head.resize(static_cast<size_t>(file.gcount()));
  return head;
}

std::string ImageFolderDataset::fingerprint() const {
  std::vector<std::filesystem::path> files;
  std::vector<std::string> captions;
  for (const CaptionedImage& sample : samples_) {
    files.push_back(sample.image);
    captions.push_back(fmt::format("{}", fmt::join(sample.captions, "\n")));
  }
  return text_fingerprint({listing_fingerprint(files), text_fingerprint(captions)});
}

}  // namespace sd::data
