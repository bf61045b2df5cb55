#include "data/image_transforms.h"

#include <cmath>

namespace sd::data {

std::pair<int, int> resized_size(int width, int height, int size) {
  const int shorter = std::min(width, height), longer = std::max(width, height);
  const int new_long = static_cast<int>(static_cast<int64_t>(size) * longer / shorter);
  return width <= height ? std::pair{size, new_long} : std::pair{new_long, size};
}

at::Tensor normalized_pixels(const io::RgbImage& image) {
  at::Tensor out = at::empty({3, image.height, image.width}, at::kFloat);
  float* dst = out.data_ptr<float>();
  const int64_t plane = static_cast<int64_t>(image.height) * image.width;
  for (int y = 0; y < image.height; ++y) {
    const uint8_t* row = image.row(y);
    for (int x = 0; x < image.width; ++x)
      for (int c = 0; c < 3; ++c)
        dst[c * plane + static_cast<int64_t>(y) * image.width + x] = (row[x * 3 + c] / 255.0f - 0.5f) / 0.5f;
  }
  return out;
}

namespace {

struct Offsets {
  int top = 0;
  int left = 0;
};

// RandomCrop's offsets of a height x width crop from `image`: top drawn first, then left, as torchvision draws them.
Offsets random_offsets(const io::RgbImage& image, int width, int height, at::Generator& gen) {
  const int top = static_cast<int>(at::randint(0, image.height - height + 1, {1}, gen).item<int64_t>());
  const int left = static_cast<int>(at::randint(0, image.width - width + 1, {1}, gen).item<int64_t>());
  return {top, left};
}

// The crop at `origin`, flipped if a draw (after the crop's) says so with random_flip, as a normalized tensor.
at::Tensor crop_flip_normalize(const io::RgbImage& image, Offsets origin, int width, int height,
                               const ImageTransformOptions& o, at::Generator& gen) {
  io::RgbImage cropped = io::crop(image, origin.top, origin.left, height, width);
  if (o.random_flip && at::rand({1}, gen).item<float>() < 0.5f) cropped = io::flip_horizontal(cropped);
  return normalized_pixels(cropped);
}

}  // namespace

at::Tensor train_transform(const io::RgbImage& image, const ImageTransformOptions& o, at::Generator& gen) {
  const auto [width, height] = resized_size(image.width, image.height, o.resolution);
  const io::RgbImage resized = io::resize(image, width, height, o.interpolation);
  // CenterCrop rounds with Python's round(): halves to even.
  const Offsets center{static_cast<int>(std::nearbyint((height - o.resolution) / 2.0)),
                       static_cast<int>(std::nearbyint((width - o.resolution) / 2.0))};
  const Offsets origin = o.center_crop ? center : random_offsets(resized, o.resolution, o.resolution, gen);
  return crop_flip_normalize(resized, origin, o.resolution, o.resolution, o, gen);
}

at::Tensor bucket_transform(const io::RgbImage& image, Resolution bucket, const ImageTransformOptions& o,
                            at::Generator& gen) {
  const BucketAssignment fit = fit_to_bucket({image.width, image.height}, bucket);
  const io::RgbImage resized = io::resize(image, fit.resized.width, fit.resized.height, o.interpolation);
  const Offsets origin =
      o.center_crop ? Offsets{fit.crop_top, fit.crop_left} : random_offsets(resized, bucket.width, bucket.height, gen);
  return crop_flip_normalize(resized, origin, bucket.width, bucket.height, o, gen);
}

}  // namespace sd::data
