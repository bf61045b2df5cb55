// Aspect-ratio buckets as kohya's sd-scripts make them (--enable_bucket): a fixed list of training sizes of about
// the same area as --resolution, each side a multiple of --bucket_reso_steps within [--min_bucket_reso,
// --max_bucket_reso]; every image goes to the bucket of the nearest aspect ratio, is resized to cover it and is
// center-cropped to it. Pure functions, so every rank computes the same buckets.
#pragma once
#include <vector>

namespace sd::data {

struct Resolution {
  int width = 0;
  int height = 0;

  bool operator==(const Resolution& o) const { return width == o.width && height == o.height; }
  bool operator<(const Resolution& o) const { return width != o.width ? width < o.width : height < o.height; }
};

struct BucketSettings {
  Resolution resolution;  // --resolution; the buckets' area is at most width * height
  int min_bucket_reso = 256;
  int max_bucket_reso = 1024;
  int bucket_reso_steps = 64;
};

// kohya's adjust_min_max_bucket_reso_by_steps: min_bucket_reso rounded down and max_bucket_reso rounded up to
// multiples of bucket_reso_steps (kohya warns when this changes them; so may the caller). Throws sd::Error naming
// the flag when a value is not positive, or when the resolution lies outside [min, max].
BucketSettings adjusted_to_steps(const BucketSettings& settings);

// kohya's make_bucket_resolutions on the adjusted settings: the square of side floor(sqrt(area) / steps) * steps,
// and for each width from min to max by steps the largest height of at most that area (a multiple of steps, at
// most max, skipped below min), with its transpose. Sorted by width, then height; no duplicates.
std::vector<Resolution> make_bucket_resolutions(const BucketSettings& settings);

struct BucketAssignment {
  Resolution bucket;          // the size the image trains at
  Resolution resized;         // the image is resized to this first: aspect ratio kept, covering the bucket
  int crop_left = 0;          // then cropped to the bucket from here (kohya's center crop without --random_crop;
  int crop_top = 0;           // a random crop takes any offset up to resized - bucket)
  double aspect_error = 0.0;  // the bucket's aspect ratio minus the image's
};

// kohya's BucketManager.select_bucket (with upscaling, the default): an image of exactly a bucket's size keeps it;
// otherwise the first bucket of the smallest aspect-ratio difference. Throws sd::Error if `buckets` is empty or
// the image has no pixels.
BucketAssignment assign_bucket(const std::vector<Resolution>& buckets, Resolution image);

// How an image of size `image` trains at `bucket`, whichever bucket it is (assign_bucket's choice, or the bucket
// planned for a sample whose replacement has another shape).
BucketAssignment fit_to_bucket(Resolution image, Resolution bucket);

}  // namespace sd::data
