// The training images and prompts of textual inversion, as diffusers' TextualInversionDataset builds them:
// every image repeated `repeats` times, optionally center-cropped, bicubic-resized, randomly flipped, scaled to
// [-1, 1], and captioned by a random object or style template around the placeholder string.
#pragma once
#include <ATen/ATen.h>

#include <filesystem>
#include <string>
#include <vector>

#include "io/image.h"

namespace sd::data {

const std::vector<std::string>& object_templates();
const std::vector<std::string>& style_templates();

// The most samples an epoch (images x --repeats) may have: its order is a permutation held in memory (8 bytes each).
inline constexpr int64_t kMaxEpochSamples = 100'000'000;

struct TextualInversionDatasetOptions {
  std::filesystem::path data_dir;
  std::string learnable_property = "object";  // or "style"
  std::string placeholder_string;             // "<tok>" or "<tok> <tok>_1 ..." for several vectors
  int resolution = 512;
  bool center_crop = false;
  int repeats = 100;
};

class TextualInversionDataset {
 public:
  // Lists the folder (sorted by name); non-image files are skipped with a warning on stderr. Throws sd::Error for a
  // missing folder, a folder without images, or an image that cannot be decoded (naming it).
  explicit TextualInversionDataset(TextualInversionDatasetOptions options);

  int64_t size() const { return static_cast<int64_t>(images_.size()) * options_.repeats; }
  int64_t num_images() const { return static_cast<int64_t>(images_.size()); }
  const std::filesystem::path& image_path(int64_t index) const { return paths_[index % paths_.size()]; }
  const std::vector<std::filesystem::path>& image_paths() const { return paths_; }
  const std::vector<std::string>& templates() const;

  // [3, resolution, resolution] float32 in [-1, 1] for dataset index `index`.
  at::Tensor pixel_values(int64_t index, bool flip) const;
  std::string prompt(int64_t template_index) const;

 private:
  TextualInversionDatasetOptions options_;
  std::vector<std::filesystem::path> paths_;
  std::vector<io::RgbImage> images_;  // decoded, cropped and resized once: every epoch reuses them
};

// [3, H, W] float32 = pixel / 127.5 - 1 (computed in double as numpy does, then rounded to float32).
at::Tensor to_pixel_values(const io::RgbImage& image);

}  // namespace sd::data
