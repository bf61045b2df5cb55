#include "data/textual_inversion_dataset.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "data/image_folder_dataset.h"

namespace sd::data {

namespace fs = std::filesystem;

const std::vector<std::string>& object_templates() {
  static const std::vector<std::string> templates = {
      "a photo of a {}",         "a rendering of a {}",      "a cropped photo of the {}", "the photo of a {}",
      "a photo of a clean {}",   "a photo of a dirty {}",    "a dark photo of the {}",    "a photo of my {}",
      "a photo of the cool {}",  "a close-up photo of a {}", "a bright photo of the {}",  "a cropped photo of a {}",
      "a photo of the {}",       "a good photo of the {}",   "a photo of one {}",         "a close-up photo of the {}",
      "a rendition of the {}",   "a photo of the clean {}",  "a rendition of a {}",       "a photo of a nice {}",
      "a good photo of a {}",    "a photo of the nice {}",   "a photo of the small {}",   "a photo of the weird {}",
      "a photo of the large {}", "a photo of a cool {}",     "a photo of a small {}",
  };
  return templates;
}

const std::vector<std::string>& style_templates() {
  static const std::vector<std::string> templates = {
      "a painting in the style of {}",         "a rendering in the style of {}",
      "a cropped painting in the style of {}", "the painting in the style of {}",
      "a clean painting in the style of {}",   "a dirty painting in the style of {}",
      "a dark painting in the style of {}",    "a picture in the style of {}",
      "a cool painting in the style of {}",    "a close-up painting in the style of {}",
      "a bright painting in the style of {}",  "a cropped painting in the style of {}",
      "a good painting in the style of {}",    "a close-up painting in the style of {}",
      "a rendition in the style of {}",        "a nice painting in the style of {}",
      "a small painting in the style of {}",   "a weird painting in the style of {}",
      "a large painting in the style of {}",
  };
  return templates;
}

TextualInversionDataset::TextualInversionDataset(TextualInversionDatasetOptions options)
    : options_(std::move(options)) {
  const fs::path& dir = options_.data_dir;
  SD_CHECK(options_.learnable_property == "object" || options_.learnable_property == "style",
           "--learnable_property: expected 'object' or 'style', got '{}'", options_.learnable_property);
  SD_CHECK(fs::is_directory(dir), "--train_data_dir {}: not a directory", dir.string());
  SD_CHECK(options_.repeats >= 1, "--repeats must be at least 1, got {}", options_.repeats);
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    if (is_image_path(entry.path())) {
      paths_.push_back(entry.path());
    } else {
      log::warn("skipping {} (not a .jpg, .jpeg, .png, .bmp or .webp image)", entry.path().string());
    }
  }
  SD_CHECK(!paths_.empty(), "--train_data_dir {}: no images (expected .jpg, .jpeg, .png, .bmp or .webp files)",
           dir.string());
  std::sort(paths_.begin(), paths_.end());
  // An epoch's order is a permutation of images x repeats, held in memory: bounded before the images are decoded.
  const int64_t epoch = static_cast<int64_t>(paths_.size()) * options_.repeats;
  SD_CHECK(epoch <= kMaxEpochSamples, "--repeats {} x {} images = {} samples per epoch, more than {}: lower --repeats",
           options_.repeats, paths_.size(), epoch, kMaxEpochSamples);
  for (const auto& path : paths_) {
    io::RgbImage image = io::load_image_rgb(path);
    if (options_.center_crop) image = io::center_crop_square(image);
    images_.push_back(io::resize(image, options_.resolution, options_.resolution, io::ResizeFilter::kBicubic));
  }
}

const std::vector<std::string>& TextualInversionDataset::templates() const {
  return options_.learnable_property == "style" ? style_templates() : object_templates();
}

at::Tensor TextualInversionDataset::pixel_values(int64_t index, bool flip) const {
  const io::RgbImage& image = images_[index % images_.size()];
  return to_pixel_values(flip ? io::flip_horizontal(image) : image);
}

std::string TextualInversionDataset::prompt(int64_t template_index) const {
  std::string text = templates().at(template_index);
  return text.replace(text.find("{}"), 2, options_.placeholder_string);
}

at::Tensor to_pixel_values(const io::RgbImage& image) {
  at::Tensor hwc = at::from_blob(const_cast<uint8_t*>(image.pixels.data()), {image.height, image.width, 3}, at::kByte);
  return (hwc.to(at::kDouble) / 127.5 - 1.0).to(at::kFloat).permute({2, 0, 1}).contiguous();
}

}  // namespace sd::data
