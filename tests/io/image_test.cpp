#include "io/image.h"

#include <fstream>

#include "core/error.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace sd::io {
namespace {

const char* kImages[] = {"landscape_160x120.jpg", "toy_alpha_100x100.png", "portrait_90x140.png"};

at::Tensor as_tensor(const RgbImage& image) {
  return at::from_blob(const_cast<uint8_t*>(image.pixels.data()), {image.height, image.width, 3}, at::kByte).clone();
}

RgbImage from_tensor(const at::Tensor& hwc) {
  auto t = hwc.contiguous();
  RgbImage image{static_cast<int>(t.size(1)), static_cast<int>(t.size(0)), {}};
  image.pixels.assign(t.data_ptr<uint8_t>(), t.data_ptr<uint8_t>() + t.numel());
  return image;
}

class ImagePreprocessing : public ::testing::Test {
 protected:
  TensorMap golden = load_safetensors(sd::test::golden("image_preprocessing.safetensors"));
};

TEST_F(ImagePreprocessing, PngDecodesExactlyAndDropsAlpha) {
  for (int i : {1, 2}) {
    RgbImage image = load_image_rgb(sd::test::golden(std::string("images/") + kImages[i]));
    EXPECT_TRUE(at::equal(as_tensor(image), golden.at(std::to_string(i) + ".decoded_rgb_uint8"))) << kImages[i];
  }
}

TEST_F(ImagePreprocessing, JpegDecodesWithinAFewLevels) {
  // stb's JPEG decoder is not libjpeg-turbo's; the fixtures README allows a few levels of difference.
  RgbImage image = load_image_rgb(sd::test::golden(std::string("images/") + kImages[0]));
  auto diff = (as_tensor(image).to(at::kInt) - golden.at("0.decoded_rgb_uint8").to(at::kInt)).abs();
  EXPECT_LE(diff.max().item<int>(), 4);
}

TEST_F(ImagePreprocessing, CenterCropAndBicubicResizeMatchPilExactly) {
  // Fed PIL's decoded pixels, the crop and resize must reproduce PIL's output bit for bit.
  for (int i : {0, 1, 2}) {
    RgbImage decoded = from_tensor(golden.at(std::to_string(i) + ".decoded_rgb_uint8"));
    RgbImage resized = resize_bicubic(center_crop_square(decoded), 64, 64);
    EXPECT_TRUE(at::equal(as_tensor(resized), golden.at(std::to_string(i) + ".resized_uint8"))) << kImages[i];
  }
}

TEST(Image, UpscaleAndNonSquareResize) {
  // Upscaling uses the unscaled filter support; a flat image stays flat in every direction and size.
  RgbImage flat{3, 5, std::vector<uint8_t>(3 * 5 * 3, 77)};
  RgbImage up = resize_bicubic(flat, 8, 4);
  EXPECT_EQ(up.width, 8);
  EXPECT_EQ(up.height, 4);
  for (uint8_t v : up.pixels) EXPECT_EQ(v, 77);
}

TEST(Image, FlipMirrorsColumns) {
  RgbImage image{2, 1, {1, 2, 3, 4, 5, 6}};
  EXPECT_EQ(flip_horizontal(image).pixels, (std::vector<uint8_t>{4, 5, 6, 1, 2, 3}));
}

TEST(Image, PngRoundTrip) {
  sd::test::TempDir dir;
  RgbImage image{3, 2, {0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150, 160, 255}};
  save_png(dir.path() / "x.png", image);
  RgbImage back = load_image_rgb(dir.path() / "x.png");
  EXPECT_EQ(back.width, 3);
  EXPECT_EQ(back.pixels, image.pixels);
}

TEST(Image, CorruptFileIsAnErrorNamingIt) {
  sd::test::TempDir dir;
  auto path = dir.path() / "broken.jpg";
  std::ofstream(path) << "not an image";
  try {
    load_image_rgb(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("broken.jpg: cannot decode image"), std::string::npos) << e.what();
  }
}

TEST(Image, MissingFile) { EXPECT_THROW(load_image_rgb("/nonexistent/a.png"), Error); }

}  // namespace
}  // namespace sd::io
