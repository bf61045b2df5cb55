// Image-caption training data in a folder, in the two layouts people keep it in:
//   Hugging Face imagefolder: images plus metadata.jsonl files whose lines name an image ("file_name", relative to
//     the metadata file's folder) and its caption column (a string, or a list of which training picks one at random),
//     as diffusers' train_text_to_image.py reads --train_data_dir with datasets' "imagefolder" builder;
//     (or metadata.csv, whose header row names the columns);
//   kohya: every image with a caption file of the same stem beside it (img.png + img.txt or img.caption); a top-level
//     folder named "N_tokens" (kohya's DreamBooth layout) repeats its images N times per epoch and captions those
//     without a caption file with "tokens". Regularization images (kohya's --reg_data_dir, DreamBooth's prior
//     preservation) are another such folder, balanced against the training images as kohya does.
// Only the listing happens here; images are read and decoded when a sample is loaded.
#pragma once
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "data/image_caption_dataset.h"

namespace sd::data {

struct CaptionedImage {
  std::filesystem::path image;
  std::vector<std::string> captions;  // one of them is the sample's caption
  double loss_weight = 1.0;           // --prior_loss_weight for a regularization image
  bool regularization = false;        // listed from --reg_data_dir
};

struct ImageFolderOptions {
  std::filesystem::path data_dir;
  std::string image_column = "image";  // "image" is imagefolder's name for the file_name column
  std::string caption_column = "text";
  std::filesystem::path skip_dir;      // a folder inside data_dir that is not listed (the run's output_dir)
  std::filesystem::path reg_data_dir;  // kohya's layout; none when empty
  double prior_loss_weight = 1.0;      // the loss weight of its images
};

class ImageFolderDataset : public ImageCaptionDataset {
 public:
  // Lists the folder, then the regularization images after its own. Throws sd::Error naming the folder or file for:
  // no such folder, no images, a metadata line that is not JSON or lacks the columns, a caption of the wrong type,
  // an image named but missing.
  explicit ImageFolderDataset(const ImageFolderOptions& options);
  // Images listed elsewhere (data/dreambooth_images.h), `layout` naming how.
  ImageFolderDataset(std::vector<CaptionedImage> samples, std::string layout)
      : samples_(std::move(samples)), layout_(std::move(layout)) {}

  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  EncodedSample read(int64_t index) const override;
  std::string image_head(int64_t index, uint64_t bytes) const override;
  std::string describe(int64_t index) const override { return samples_.at(index).image.string(); }
  std::string layout() const override { return layout_; }
  void select(const std::vector<int64_t>& indices) override { keep_indices(samples_, indices); }
  // Each image's name and size, and each sample's captions.
  std::string fingerprint() const override;
  SampleCounts sample_counts() const override;

 private:
  std::vector<CaptionedImage> samples_;
  std::string layout_;
  int64_t regularization_listed_ = 0;  // regularization images times their repeats, before balancing
};

bool is_image_path(const std::filesystem::path& path);

}  // namespace sd::data
