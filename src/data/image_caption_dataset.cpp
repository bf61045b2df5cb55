#include "data/image_caption_dataset.h"

#include "core/log.h"
#include "data/prefetcher.h"

namespace sd::data {

namespace {

io::RgbImage decode_image(const std::string& bytes, const std::string& name) {
  try {
    return io::decode_image_rgb(bytes, name);
  } catch (const Error& e) {
    throw UnusableSample(e.what());
  }
}

// Enough of a file for the headers of nearly every image; JPEGs with a large EXIF block before their frame header
// are read whole.
constexpr uint64_t kImageHeadBytes = 16 * 1024;

std::optional<Resolution> size_from_header(const ImageCaptionDataset& dataset, int64_t index) {
  std::string head = dataset.image_head(index, kImageHeadBytes);
  std::optional<std::pair<int, int>> size = io::image_size(head);
  if (!size && head.size() == kImageHeadBytes) size = io::image_size(dataset.image_head(index, UINT64_MAX));
  if (!size) return std::nullopt;
  return Resolution{size->first, size->second};
}

}  // namespace

DecodedSample ImageCaptionDataset::decode(int64_t index) const {
  const int64_t n = size();
  for (int64_t tried = 0; tried < n; ++tried) {
    const int64_t candidate = (index + tried) % n;
    try {
      EncodedSample sample = read(candidate);
      return {decode_image(sample.image, describe(candidate)), std::move(sample.captions), sample.loss_weight};
    } catch (const UnusableSample& e) {
      const std::lock_guard<std::mutex> lock(replaced_mutex_);
      if (replaced_.insert(candidate).second)
        log::warn_every_rank("{}; the next sample is used in its place ({} sample(s) replaced so far)", e.what(),
                             replaced_.size());
    }
  }
  fail("none of the {} training samples can be used (every image fails to decode or has no readable caption)", n);
}

std::vector<Resolution> image_sizes(const ImageCaptionDataset& dataset, Resolution fallback, int threads) {
  // Chunks of samples per job: one job per image would cost more in bookkeeping than the header read.
  constexpr int64_t kChunk = 256;
  Prefetcher<std::vector<std::optional<Resolution>>> workers(threads);
  for (int64_t begin = 0; begin < dataset.size(); begin += kChunk) {
    const int64_t end = std::min(dataset.size(), begin + kChunk);
    workers.request([&dataset, begin, end] {
      std::vector<std::optional<Resolution>> sizes;
      for (int64_t i = begin; i < end; ++i) sizes.push_back(size_from_header(dataset, i));
      return sizes;
    });
  }
  std::vector<Resolution> sizes;
  int64_t unreadable = 0;
  std::string example;
  double ignored = 0;
  while (workers.pending() > 0) {
    for (const std::optional<Resolution>& size : workers.next(ignored)) {
      if (!size && unreadable++ == 0) example = dataset.describe(static_cast<int64_t>(sizes.size()));
      sizes.push_back(size.value_or(fallback));
    }
  }
  if (unreadable > 0)
    log::warn_every_rank("{} image(s) have no readable size in their header (e.g. {}); they are bucketed as {}x{}",
                         unreadable, example, fallback.width, fallback.height);
  return sizes;
}

}  // namespace sd::data
