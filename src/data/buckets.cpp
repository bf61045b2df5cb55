#include "data/buckets.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.h"

namespace sd::data {

namespace {

double aspect_ratio(Resolution r) { return static_cast<double>(r.width) / r.height; }

// Python's int(x + 0.5) for x >= 0: kohya's rounding of resized sides.
int round_half_up(double x) { return static_cast<int>(x + 0.5); }

}  // namespace

BucketSettings adjusted_to_steps(const BucketSettings& settings) {
  const int steps = settings.bucket_reso_steps;
  // Bucket sides must survive the VAE's and the UNet's halvings, as --resolution must.
  SD_CHECK(steps > 0 && steps % 8 == 0, "--bucket_reso_steps is {}; expected a positive multiple of 8 pixels", steps);
  SD_CHECK(settings.min_bucket_reso > 0, "--min_bucket_reso is {}; expected a positive number of pixels",
           settings.min_bucket_reso);
  SD_CHECK(settings.resolution.width > 0 && settings.resolution.height > 0,
           "--resolution is {}x{}; expected a positive size", settings.resolution.width, settings.resolution.height);
  BucketSettings out = settings;
  out.min_bucket_reso -= out.min_bucket_reso % steps;
  if (out.max_bucket_reso % steps != 0) out.max_bucket_reso += steps - out.max_bucket_reso % steps;
  const int smaller_side = std::min(out.resolution.width, out.resolution.height);
  const int larger_side = std::max(out.resolution.width, out.resolution.height);
  SD_CHECK(out.min_bucket_reso > 0 && out.min_bucket_reso <= smaller_side,
           "--min_bucket_reso {} (rounded down to a multiple of --bucket_reso_steps {}: {}); expected at least {} and "
           "at most the resolution, {}",
           settings.min_bucket_reso, steps, out.min_bucket_reso, steps, smaller_side);
  SD_CHECK(out.max_bucket_reso >= larger_side,
           "--max_bucket_reso {} (rounded up to a multiple of --bucket_reso_steps {}: {}); expected at least the "
           "resolution, {}",
           settings.max_bucket_reso, steps, out.max_bucket_reso, larger_side);
  return out;
}

std::vector<Resolution> make_bucket_resolutions(const BucketSettings& settings) {
  const BucketSettings s = adjusted_to_steps(settings);
  const int steps = s.bucket_reso_steps;
  const int64_t max_area = static_cast<int64_t>(s.resolution.width) * s.resolution.height;
  std::set<Resolution> resolutions;
  // Python's float floor division, exact where a plain floor(a / b) could round up to the next integer.
  const double root = std::sqrt(static_cast<double>(max_area));
  const int square_side = static_cast<int>((root - std::fmod(root, steps)) / steps) * steps;
  resolutions.insert({square_side, square_side});
  for (int width = s.min_bucket_reso; width <= s.max_bucket_reso; width += steps) {
    const int64_t fitting_height = max_area / width / steps * steps;
    const int height = static_cast<int>(std::min<int64_t>(s.max_bucket_reso, fitting_height));
    if (height < s.min_bucket_reso) continue;
    resolutions.insert({width, height});
    resolutions.insert({height, width});
  }
  return std::vector<Resolution>(resolutions.begin(), resolutions.end());
}

BucketAssignment assign_bucket(const std::vector<Resolution>& buckets, Resolution image) {
  SD_CHECK(!buckets.empty(), "no buckets to assign an image to");
  SD_CHECK(image.width > 0 && image.height > 0, "cannot bucket an image of {}x{} pixels", image.width, image.height);
  if (std::find(buckets.begin(), buckets.end(), image) != buckets.end()) return fit_to_bucket(image, image);
  // np.argmin: the first of the smallest differences, in the buckets' sorted order.
  const double image_ratio = aspect_ratio(image);
  return fit_to_bucket(image, *std::min_element(buckets.begin(), buckets.end(), [&](Resolution x, Resolution y) {
                         return std::abs(aspect_ratio(x) - image_ratio) < std::abs(aspect_ratio(y) - image_ratio);
                       }));
}

BucketAssignment fit_to_bucket(Resolution image, Resolution bucket) {
  BucketAssignment a;
  a.bucket = bucket;
  // Scale so the image covers the bucket: match the side along which the image is relatively shorter.
  const double image_ratio = aspect_ratio(image);
  const double scale = image_ratio > aspect_ratio(bucket) ? static_cast<double>(bucket.height) / image.height
                                                          : static_cast<double>(bucket.width) / image.width;
  a.resized = {round_half_up(image.width * scale), round_half_up(image.height * scale)};
  // Covering means resized >= bucket on both sides, so the offsets are never negative.
  a.crop_left = (a.resized.width - bucket.width) / 2;
  a.crop_top = (a.resized.height - bucket.height) / 2;
  a.aspect_error = aspect_ratio(bucket) - image_ratio;
  return a;
}

}  // namespace sd::data
