#include "io/image.h"

#include <webp/encode.h>

#include <fstream>
#include <functional>
#include <iterator>

#include "core/error.h"
#include "io/jpeg.h"
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

TEST_F(ImagePreprocessing, JpegDecodesExactlyAsPil) {
  RgbImage image = load_image_rgb(sd::test::golden(std::string("images/") + kImages[0]));
  EXPECT_TRUE(at::equal(as_tensor(image), golden.at("0.decoded_rgb_uint8")));
}

TEST_F(ImagePreprocessing, CenterCropAndBicubicResizeMatchPilExactly) {
  // Fed PIL's decoded pixels, the crop and resize must reproduce PIL's output bit for bit.
  for (int i : {0, 1, 2}) {
    RgbImage decoded = from_tensor(golden.at(std::to_string(i) + ".decoded_rgb_uint8"));
    RgbImage resized = resize(center_crop_square(decoded), 64, 64, ResizeFilter::kBicubic);
    EXPECT_TRUE(at::equal(as_tensor(resized), golden.at(std::to_string(i) + ".resized_uint8"))) << kImages[i];
  }
}

TEST(Image, UpscaleAndNonSquareResize) {
  // Upscaling uses the unscaled filter support; a flat image stays flat in every direction and size.
  RgbImage flat{3, 5, std::vector<uint8_t>(3 * 5 * 3, 77)};
  RgbImage up = resize(flat, 8, 4, ResizeFilter::kBicubic);
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

std::string file_bytes(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

TEST(Image, EveryFilterResizesExactlyAsPil) {
  // tests/fixtures/resize: a 53x37 image with hard edges and noise, and Pillow's resize of it with each filter to
  // sizes that scale down, up, one axis only, and down in one axis while up in the other.
  const std::string input = file_bytes(sd::test::fixtures() / "resize" / "input.rgb");
  const RgbImage image{53, 37, std::vector<uint8_t>(input.begin(), input.end())};
  for (const char* filter : {"bilinear", "bicubic", "lanczos", "box", "hamming", "nearest"}) {
    for (auto [width, height] : {std::pair{24, 17}, {31, 37}, {53, 20}, {80, 59}, {7, 5}, {40, 61}}) {
      const std::string name = fmt::format("{}_{}x{}", filter, width, height);
      const RgbImage resized = resize(image, width, height, resize_filter_named(filter).value());
      ASSERT_EQ(resized.width, width) << name;
      ASSERT_EQ(resized.height, height) << name;
      EXPECT_TRUE(std::string(resized.pixels.begin(), resized.pixels.end()) ==
                  file_bytes(sd::test::fixtures() / "resize" / (name + ".rgb")))
          << name;
    }
  }
  // Where inputs lie exactly half a box away from an output's centre: PIL's box is closed on the right.
  const RgbImage box = resize(image, 16, 8, ResizeFilter::kBox);
  EXPECT_TRUE(std::string(box.pixels.begin(), box.pixels.end()) ==
              file_bytes(sd::test::fixtures() / "resize" / "box_16x8.rgb"));
}

TEST(Image, NearestSumsItsPositionsAsPil) {
  // From an even size some positions PIL sums step by step land just below an integer that (x + 0.5) * step
  // reaches exactly, so a nearest resize by that formula reads the next pixel at those outputs.
  const std::string input = file_bytes(sd::test::fixtures() / "resize" / "input.rgb");
  const RgbImage even = crop(RgbImage{53, 37, std::vector<uint8_t>(input.begin(), input.end())}, 0, 0, 36, 52);
  for (auto [width, height] : {std::pair{17, 15}, {78, 54}}) {
    const std::string name = fmt::format("nearest-even_{}x{}", width, height);
    const RgbImage resized = resize(even, width, height, ResizeFilter::kNearest);
    EXPECT_TRUE(std::string(resized.pixels.begin(), resized.pixels.end()) ==
                file_bytes(sd::test::fixtures() / "resize" / (name + ".rgb")))
        << name;
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Image, DecodingFromMemoryGivesWhatLoadingTheFileGives) {
  for (const char* name : kImages) {
    const auto path = sd::test::golden(std::string("images/") + name);
    const RgbImage from_memory = decode_image_rgb(file_bytes(path), name);
    const RgbImage from_file = load_image_rgb(path);
    EXPECT_EQ(from_memory.width, from_file.width) << name;
    EXPECT_EQ(from_memory.pixels, from_file.pixels) << name;
  }
}

TEST(Image, WebpDecodesAndDropsAlpha) {
  // Lossless WebP gives back exactly the encoded pixels.
  const int width = 5, height = 3;
  std::vector<uint8_t> rgba(width * height * 4);
  for (size_t k = 0; k < rgba.size(); ++k) rgba[k] = static_cast<uint8_t>(k * 37 % 256);
  for (size_t k = 3; k < rgba.size(); k += 4) rgba[k] = 255;  // opaque, so the RGB values survive encoding
  uint8_t* encoded = nullptr;
  const size_t size = WebPEncodeLosslessRGBA(rgba.data(), width, height, width * 4, &encoded);
  ASSERT_GT(size, 0u);
  const RgbImage image = decode_image_rgb(std::string(reinterpret_cast<char*>(encoded), size), "x.webp");
  WebPFree(encoded);
  ASSERT_EQ(image.width, width);
  ASSERT_EQ(image.height, height);
  for (int p = 0; p < width * height; ++p)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(image.pixels[p * 3 + c], rgba[p * 4 + c]) << p;
}

TEST(Image, CorruptDataIsAnErrorNamingTheMember) {
  EXPECT_EQ(error_of([] {
              decode_image_rgb("not an image", "00000.tar:000001.jpg");
            }).rfind("00000.tar:000001.jpg: cannot decode image", 0),
            0u);
  EXPECT_EQ(error_of([] { decode_image_rgb(std::string("RIFF\x10\0\0\0WEBPVP8 garbage", 23), "a.webp"); }),
            "a.webp: cannot decode image (corrupt WebP data)");
}

TEST(Image, JpegVariantsDecodeExactlyAsPil) {
  // tests/fixtures/jpeg: files Pillow wrote and the bytes Pillow decodes from them.
  for (const char* name : {"baseline_420", "progressive_422", "grayscale", "cmyk"}) {
    const auto case_path = sd::test::fixtures() / "jpeg" / name;
    const RgbImage image = decode_image_rgb(file_bytes(case_path.string() + ".jpg"), name);
    EXPECT_EQ(image.width, 37) << name;
    EXPECT_EQ(image.height, 23) << name;
    const std::string pixels(image.pixels.begin(), image.pixels.end());
    EXPECT_TRUE(pixels == file_bytes(case_path.string() + ".rgb")) << name;
  }
}

TEST(Image, JpegEncodingWritesPilsBytes) {
  // baseline_420.jpg is what Pillow's image.save(..., "JPEG", quality=75) wrote for make_cases.py's pattern(37, 23).
  RgbImage pattern{37, 23, std::vector<uint8_t>(37 * 23 * 3)};
  for (int y = 0; y < 23; ++y)
    for (int x = 0; x < 37; ++x) {
      uint8_t* p = pattern.row(y) + 3 * x;
      p[0] = static_cast<uint8_t>((x * 7 + y * 3) % 256);
      p[1] = static_cast<uint8_t>((x * y) % 256);
      p[2] = static_cast<uint8_t>((x / 5 + y / 4) % 2 ? 255 : (y * 11) % 256);
    }
  EXPECT_TRUE(encode_jpeg(pattern, 75) == file_bytes(sd::test::fixtures() / "jpeg" / "baseline_420.jpg"));
  EXPECT_FALSE(encode_jpeg(pattern, 90) == file_bytes(sd::test::fixtures() / "jpeg" / "baseline_420.jpg"));
}

TEST(Image, TruncatedJpegIsAnErrorAsInPil) {
  const std::string bytes = file_bytes(sd::test::fixtures() / "jpeg" / "truncated.jpg");
  EXPECT_EQ(error_of([&] { decode_image_rgb(bytes, "cut.jpg"); }),
            "cut.jpg: cannot decode image (corrupt JPEG data: Premature end of JPEG file)");
  // Its headers are whole, so its size is known; a head cut inside them gives none.
  EXPECT_EQ(image_size(bytes), std::make_pair(37, 23));
  EXPECT_FALSE(image_size(bytes.substr(0, 100)).has_value());
}

TEST(Image, JpegWithAnOverfullHuffmanTableIsAnError) {
  // A DHT segment whose code counts add up to more than 256 symbols: Debian's stb wrote past its tables on this.
  std::string jpeg = file_bytes(sd::test::fixtures() / "jpeg" / "baseline_420.jpg");
  const size_t dht = jpeg.find("\xFF\xC4");
  ASSERT_NE(dht, std::string::npos);
  for (int i = 0; i < 16; ++i) jpeg[dht + 5 + i] = static_cast<char>(0xFF);
  EXPECT_EQ(error_of([&] {
              decode_image_rgb(jpeg, "dht.jpg");
            }).rfind("dht.jpg: cannot decode image (corrupt JPEG data: ", 0),
            0u);
  EXPECT_FALSE(image_size(jpeg).has_value());
}

TEST(Image, JpegOfMoreThan500ScansIsRefused) {
  // The last scan of a progressive file repeated 600 times: each repeat would be one more pass over the image.
  std::string jpeg = file_bytes(sd::test::fixtures() / "jpeg" / "progressive_422.jpg");
  const size_t last_scan = jpeg.rfind("\xFF\xDA"), end = jpeg.rfind("\xFF\xD9");
  ASSERT_LT(last_scan, end);
  const std::string scan = jpeg.substr(last_scan, end - last_scan);
  for (int i = 0; i < 600; ++i) jpeg.insert(end, scan);
  EXPECT_EQ(error_of([&] { decode_image_rgb(jpeg, "scans.jpg"); }),
            "scans.jpg: cannot decode image (corrupt JPEG data: more than 500 progressive scans)");
}

TEST(Image, OnlyJpegPngBmpAndWebpReachADecoder) {
  // An 18-byte TGA header (no signature: type 2, 2x2, 24 bits) followed by anything is a valid TGA to stb, so a damaged
  // file could decode as noise; GIF is a format stb reads but sdtrain does not claim.
  const std::string tga = std::string("\0\0\x02\0\0\0\0\0\0\0\0\0\x02\0\x02\0\x18\0", 18) + "garbage-data";
  const std::string gif = std::string(
      "GIF89a\x01\0\x01\0\x80\0\0\0\0\0\xff\xff\xff!\xf9\x04\x01\0\0\0\0,\0\0\0\0\x01\0\x01\0\0\x02\x02"
      "D\x01\0;",
      43);
  for (const auto& [bytes, name] : {std::pair{tga, "a.tga"}, std::pair{gif, "a.gif"}}) {
    EXPECT_EQ(error_of([&] { decode_image_rgb(bytes, name); }),
              std::string(name) + ": cannot decode image (unknown format); expected a JPEG, PNG, BMP or WebP file");
    EXPECT_FALSE(image_size(bytes).has_value()) << name;
  }
}

TEST(Image, ImageOfMorePixelsThanPilAllowsIsRefusedBeforeDecoding) {
  // A PNG signature and header chunk claiming 15000x15000 RGB pixels (stb does not check the CRC).
  std::string png = "\x89PNG\r\n\x1a\n";
  png += std::string("\0\0\0\x0d", 4) + "IHDR";
  png += std::string("\0\0\x3a\x98\0\0\x3a\x98\x08\x02\0\0\0", 13) + std::string(4, '\0');
  EXPECT_EQ(error_of([&] { decode_image_rgb(png, "bomb.png"); }),
            "bomb.png: image of 15000x15000 pixels; expected at most 178956970 pixels (PIL's decompression-bomb "
            "limit)");
}

}  // namespace
}  // namespace sd::io
