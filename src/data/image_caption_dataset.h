// Image-caption training data before decoding, wherever it is kept: an image folder (data/image_folder_dataset.h)
// or WebDataset tar shards (data/webdataset.h). A dataset is map-style: sample i's encoded image and captions can be
// read on their own, on any thread, so the sampler's permutation decides what each rank reads and nothing else does.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/error.h"
#include "data/buckets.h"
#include "data/sampler.h"
#include "io/image.h"

namespace sd::data {

// A sample whose content cannot be used (its image does not decode, its caption cannot be read). The loader
// replaces it (ImageCaptionDataset::decode) rather than stopping a run over one bad member of millions.
class UnusableSample : public Error {
 public:
  using Error::Error;
};

// A sample's image file, not yet decoded, and its captions.
struct EncodedSample {
  std::string image;                  // the bytes of a JPEG, PNG, BMP or WebP file
  std::vector<std::string> captions;  // one of them is the sample's caption
  double loss_weight = 1.0;           // kohya's --prior_loss_weight for a regularization image
};

// A listing's samples as kohya counts them for its LoRA metadata (ss_num_train_images, ss_num_reg_images): training
// samples (images times their repeats), and regularization samples as listed, before they are balanced against the
// training ones.
struct SampleCounts {
  int64_t training = 0;
  int64_t regularization = 0;
};

struct DecodedSample {
  io::RgbImage image;
  std::vector<std::string> captions;
  double loss_weight = 1.0;
};

class ImageCaptionDataset {
 public:
  virtual ~ImageCaptionDataset() = default;

  virtual int64_t size() const = 0;
  // Throws UnusableSample when the sample's content is malformed, sd::Error when its file cannot be read (it
  // vanished or shrank since it was listed), which no other sample can make up for.
  virtual EncodedSample read(int64_t index) const = 0;
  // The first `bytes` bytes of the sample's image file (all of it when shorter): its header, for its size.
  virtual std::string image_head(int64_t index, uint64_t bytes) const = 0;
  // Names the sample in messages: its file, or its shard and where in it.
  virtual std::string describe(int64_t index) const = 0;
  // "imagefolder", "kohya" or "webdataset".
  virtual std::string layout() const = 0;
  // Keeps the samples at `indices`, in that order.
  virtual void select(const std::vector<int64_t>& indices) = 0;
  // A digest of what was listed (data/listing_fingerprint.h): ranks compare it at start-up, since each node may
  // hold its own copy of the data.
  virtual std::string fingerprint() const = 0;
  virtual SampleCounts sample_counts() const { return {size(), 0}; }

  // Sample `index` decoded; if it is unusable, the next sample (wrapping around) that is, with a warning the first
  // time each sample is replaced, counting them. The replacement depends on the index alone, so every rank and every
  // resumed run trains on the same one. Throws sd::Error when a file cannot be read, or when no sample at all is
  // usable.
  DecodedSample decode(int64_t index) const;

 private:
  // Loader threads decode concurrently.
  mutable std::mutex replaced_mutex_;
  mutable std::unordered_set<int64_t> replaced_;
};

// The size of every sample's image, read from the headers alone, on `threads` threads (for aspect-ratio buckets).
// An image whose header cannot be read gets `fallback` (it will be replaced when loaded), with one warning counting
// them.
std::vector<Resolution> image_sizes(const ImageCaptionDataset& dataset, Resolution fallback, int threads);

}  // namespace sd::data
