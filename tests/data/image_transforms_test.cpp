// train_transform against Pillow's own resize: torchvision's Resize(17) of a 53x37 image is PIL's resize to 24x17
// with the chosen filter (the tests/fixtures/resize goldens), then CenterCrop(17) takes columns 4..20 (Python's
// round(3.5) = 4).
#include "data/image_transforms.h"

#include <fstream>
#include <iterator>

#include "data/random_streams.h"
#include "test_util.h"

namespace sd::data {
namespace {

std::string fixture_bytes(const std::string& name) {
  std::ifstream file(sd::test::fixtures() / "resize" / name, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

io::RgbImage fixture_image(const std::string& name, int width, int height) {
  const std::string bytes = fixture_bytes(name);
  EXPECT_EQ(bytes.size(), static_cast<size_t>(width) * height * 3) << name;
  return {width, height, std::vector<uint8_t>(bytes.begin(), bytes.end())};
}

TEST(ImageTransforms, EachInterpolationModeResizesAsPilThenCrops) {
  const io::RgbImage input = fixture_image("input.rgb", 53, 37);
  at::Generator gen = stream_generator(0, Stream::kAugment, 0);
  std::vector<at::Tensor> outputs;
  for (const char* name : {"bilinear", "bicubic", "lanczos", "box", "hamming", "nearest"}) {
    ImageTransformOptions o{17, /*center_crop=*/true, /*random_flip=*/false};
    o.interpolation = *io::resize_filter_named(name);
    const io::RgbImage pil = fixture_image(fmt::format("{}_24x17.rgb", name), 24, 17);
    const at::Tensor expected = normalized_pixels(io::crop(pil, 0, 4, 17, 17));
    const at::Tensor got = train_transform(input, o, gen);
    EXPECT_TRUE(at::equal(got, expected)) << name;
    outputs.push_back(got);
  }
  EXPECT_FALSE(at::equal(outputs[0], outputs[2])) << "the filters differ on this image";
}

TEST(ImageTransforms, FilterNamesAreTorchvisionsAndOthersAreRefused) {
  for (const char* name : {"bilinear", "bicubic", "lanczos", "box", "hamming", "nearest"})
    EXPECT_EQ(io::resize_filter_name(*io::resize_filter_named(name)), name);
  // On a PIL image torchvision resizes NEAREST_EXACT with PIL's NEAREST.
  EXPECT_EQ(io::resize_filter_named("nearest_exact"), io::ResizeFilter::kNearest);
  for (const char* name : {"area", "nearest-exact", "Lanczos", ""}) EXPECT_FALSE(io::resize_filter_named(name));
}

}  // namespace
}  // namespace sd::data
