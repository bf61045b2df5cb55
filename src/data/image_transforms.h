// diffusers train_text_to_image.py's train_transforms, as torchvision computes them on a PIL image:
//   Resize(resolution, BILINEAR)    shorter side to `resolution` (antialiased, PIL's fixed-point resampler; later
//                                   scripts take --image_interpolation_mode, default lanczos)
//   CenterCrop / RandomCrop         a resolution x resolution square
//   RandomHorizontalFlip            with --random_flip
//   ToTensor, Normalize(0.5, 0.5)   float32 (x / 255 - 0.5) / 0.5, CHW
// and with aspect-ratio buckets kohya's: resized to cover the bucket, cropped to it, flipped.
// The crop offsets and the flip come from the caller's generator, in torchvision's order of draws. Safe to run on
// loader threads: nothing here starts LibTorch's intra-op pool.
#pragma once
#include <ATen/ATen.h>

#include "data/buckets.h"
#include "io/image.h"

namespace sd::data {

struct ImageTransformOptions {
  int resolution = 512;
  bool center_crop = false;
  bool random_flip = false;
  io::ResizeFilter interpolation = io::ResizeFilter::kBilinear;  // diffusers 0.24's; its later scripts' is lanczos
};

// torchvision's Resize(int) output size: the shorter side becomes `size`, the longer int(size * long / short).
std::pair<int, int> resized_size(int width, int height, int size);

// -> [3, resolution, resolution] float32 in [-1, 1]
at::Tensor train_transform(const io::RgbImage& image, const ImageTransformOptions& options, at::Generator& gen);

// -> [3, bucket.height, bucket.width] float32 in [-1, 1]: the image resized to cover the bucket with its aspect
// ratio kept (PIL's antialiased filter; kohya resizes with OpenCV's INTER_AREA), cropped to it (centered as kohya does
// with center_crop, else at random offsets), flipped with random_flip. `options.resolution` is not used.
at::Tensor bucket_transform(const io::RgbImage& image, Resolution bucket, const ImageTransformOptions& options,
                            at::Generator& gen);

// ToTensor + Normalize(0.5, 0.5): [3, H, W] float32.
at::Tensor normalized_pixels(const io::RgbImage& image);

}  // namespace sd::data
