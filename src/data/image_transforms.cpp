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

at::Tensor train_transform(const io::RgbImage& image, const ImageTransformOptions& o, at::Generator& gen) {
  const auto [width, height] = resized_size(image.width, image.height, o.resolution);
  io::RgbImage resized = io::resize_bilinear(image, width, height);
  int top = 0, left = 0;
  if (o.center_crop) {
    // torchvision rounds with Python's round(): halves to even.
    top = static_cast<int>(std::nearbyint((height - o.resolution) / 2.0));
    left = static_cast<int>(std::nearbyint((width - o.resolution) / 2.0));
  } else {
    top = static_cast<int>(at::randint(0, height - o.resolution + 1, {1}, gen).item<int64_t>());
    left = static_cast<int>(at::randint(0, width - o.resolution + 1, {1}, gen).item<int64_t>());
  }
  io::RgbImage square = io::crop(resized, top, left, o.resolution, o.resolution);
  if (o.random_flip && at::rand({1}, gen).item<float>() < 0.5f) square = io::flip_horizontal(square);
  return normalized_pixels(square);
}

}  // namespace sd::data
