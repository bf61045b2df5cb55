#include "data/buckets.h"

#include <algorithm>

#include "core/error.h"
#include "test_util.h"

namespace sd::data {
namespace {

using Resolutions = std::vector<Resolution>;

// Worked by hand from kohya's make_bucket_resolutions: area 512*512 = 262144; width w from 256 to 1024 by 64 gets
// height min(1024, 262144 // w // 64 * 64), kept when >= 256, with its transpose; plus the 512x512 square.
// e.g. w=320: 262144 // 320 = 819, // 64 = 12 -> 768; w=704: 372 // 64 = 5 -> 320; w=832: 315 // 64 = 4 -> 256.
const Resolutions kSd15Buckets = {{256, 832}, {256, 896}, {256, 960}, {256, 1024}, {320, 704}, {320, 768},
                                  {384, 640}, {448, 576}, {512, 512}, {576, 448},  {640, 384}, {704, 320},
                                  {768, 320}, {832, 256}, {896, 256}, {960, 256},  {1024, 256}};

BucketSettings settings(int resolution, int min_reso = 256, int max_reso = 1024, int steps = 64) {
  return BucketSettings{{resolution, resolution}, min_reso, max_reso, steps};
}

TEST(Buckets, Resolution512WithKohyaDefaults) { EXPECT_EQ(make_bucket_resolutions(settings(512)), kSd15Buckets); }

TEST(Buckets, Resolution768WithOtherLimits) {
  // Area 589824; w=320: 1843 // 64 = 28 -> 1792, capped at max 1536; w=384: 1536 // 64 * 64 = 1536;
  // w=1536: 384 -> 384 (and its transpose 384x1536).
  const Resolutions buckets = make_bucket_resolutions(settings(768, 320, 1536));
  EXPECT_EQ(buckets.size(), 27u);
  EXPECT_EQ(buckets.front(), (Resolution{320, 1536}));
  EXPECT_EQ(buckets[1], (Resolution{384, 1344}));
  EXPECT_EQ(buckets.back(), (Resolution{1536, 384}));
  EXPECT_NE(std::find(buckets.begin(), buckets.end(), Resolution{768, 768}), buckets.end());
}

TEST(Buckets, NonSquareResolutionUsesItsArea) {
  // 512x768: area 393216, square side floor(627.07 / 64) * 64 = 576.
  const Resolutions buckets = make_bucket_resolutions(BucketSettings{{512, 768}, 256, 1024, 64});
  EXPECT_EQ(buckets.size(), 19u);
  EXPECT_NE(std::find(buckets.begin(), buckets.end(), Resolution{576, 576}), buckets.end());
  EXPECT_EQ(buckets[8], (Resolution{576, 576}));
}

TEST(Buckets, LimitsAreRoundedToStepsAndChecked) {
  const BucketSettings adjusted = adjusted_to_steps(settings(512, 300, 1000));
  EXPECT_EQ(adjusted.min_bucket_reso, 256);
  EXPECT_EQ(adjusted.max_bucket_reso, 1024);
  EXPECT_THROW(adjusted_to_steps(settings(512, 640)), sd::Error);           // min above the resolution
  EXPECT_THROW(adjusted_to_steps(settings(512, 256, 448)), sd::Error);      // max below it
  EXPECT_THROW(adjusted_to_steps(settings(512, 256, 1024, 0)), sd::Error);  // no steps
  EXPECT_EQ(sd::test::error_of([] { adjusted_to_steps(settings(48, 16, 64, 12)); }),
            "--bucket_reso_steps is 12; expected a positive multiple of 8 pixels");
}

TEST(Buckets, ImageGoesToTheNearestAspectRatioCoversItAndIsCenterCropped) {
  // 1000x750 (4:3): nearest is 576x448 (1.2857; 640x384 is 1.667); the image is wider, so its height is matched:
  // scale 448 / 750, width int(1000 * 0.59733 + 0.5) = 597, crop (597 - 576) // 2 = 10 from the left.
  BucketAssignment a = assign_bucket(kSd15Buckets, {1000, 750});
  EXPECT_EQ(a.bucket, (Resolution{576, 448}));
  EXPECT_EQ(a.resized, (Resolution{597, 448}));
  EXPECT_EQ(a.crop_left, 10);
  EXPECT_EQ(a.crop_top, 0);
  EXPECT_DOUBLE_EQ(a.aspect_error, 576.0 / 448 - 1000.0 / 750);

  a = assign_bucket(kSd15Buckets, {750, 1000});  // portrait: width matched, cropped from the top
  EXPECT_EQ(a.bucket, (Resolution{448, 576}));
  EXPECT_EQ(a.resized, (Resolution{448, 597}));
  EXPECT_EQ(a.crop_top, 10);

  a = assign_bucket(kSd15Buckets, {1920, 1080});  // 16:9 -> 640x384, 683 wide
  EXPECT_EQ(a.bucket, (Resolution{640, 384}));
  EXPECT_EQ(a.resized, (Resolution{683, 384}));
  EXPECT_EQ(a.crop_left, 21);
}

TEST(Buckets, ExactSizesKeepTheirBucketAndSmallImagesAreUpscaled) {
  EXPECT_EQ(assign_bucket(kSd15Buckets, {640, 384}).resized, (Resolution{640, 384}));
  const BucketAssignment small = assign_bucket(kSd15Buckets, {333, 333});
  EXPECT_EQ(small.bucket, (Resolution{512, 512}));
  EXPECT_EQ(small.resized, (Resolution{512, 512}));
  // Far beyond the extreme buckets: the most extreme one, still covered.
  const BucketAssignment tall = assign_bucket(kSd15Buckets, {100, 3000});
  EXPECT_EQ(tall.bucket, (Resolution{256, 1024}));
  EXPECT_EQ(tall.resized, (Resolution{256, 7680}));
  EXPECT_EQ(tall.crop_top, 3328);
}

TEST(Buckets, TiesGoToTheFirstBucketInSortedOrder) {
  // 3:2 lies exactly between 1:1 and 2:1.
  const BucketAssignment a = assign_bucket({{100, 100}, {200, 100}}, {150, 100});
  EXPECT_EQ(a.bucket, (Resolution{100, 100}));
}

TEST(Buckets, BadInputIsAnError) {
  EXPECT_THROW(assign_bucket({}, {10, 10}), sd::Error);
  EXPECT_THROW(assign_bucket(kSd15Buckets, {0, 10}), sd::Error);
}

}  // namespace
}  // namespace sd::data
