// Image-caption training data on disk, in the two layouts people keep it in:
//   Hugging Face imagefolder: images plus metadata.jsonl files whose lines name an image ("file_name", relative to
//     the metadata file's folder) and its caption column (a string, or a list of which training picks one at random),
//     as diffusers' train_text_to_image.py reads --train_data_dir with datasets' "imagefolder" builder;
//   kohya: every image with a caption file of the same stem beside it (img.png + img.txt or img.caption).
// Only the listing happens here; images are decoded when a sample is loaded (data/image_transforms.h).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace sd::data {

struct ImageCaptionSample {
  std::filesystem::path image;
  std::vector<std::string> captions;  // one of them is the sample's caption
};

struct ImageCaptionDatasetOptions {
  std::filesystem::path data_dir;
  std::string image_column = "image";  // "image" is imagefolder's name for the file_name column
  std::string caption_column = "text";
};

class ImageCaptionDataset {
 public:
  // Lists the folder. Throws sd::Error naming the folder or file for: no such folder, no images, a metadata line
  // that is not JSON or lacks the columns, a caption of the wrong type, an image named but missing.
  explicit ImageCaptionDataset(const ImageCaptionDatasetOptions& options);

  int64_t size() const { return static_cast<int64_t>(samples_.size()); }
  const ImageCaptionSample& sample(int64_t index) const { return samples_.at(index); }
  // "imagefolder" or "kohya".
  const std::string& layout() const { return layout_; }
  // Keeps the samples at `indices`, in that order (--max_train_samples).
  void select(const std::vector<int64_t>& indices);

 private:
  std::vector<ImageCaptionSample> samples_;
  std::string layout_;
};

bool is_image_path(const std::filesystem::path& path);

}  // namespace sd::data
