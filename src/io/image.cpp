#include "io/image.h"

#include <stb_image.h>
#include <stb_image_write.h>
#include <webp/decode.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/jpeg.h"

namespace sd::io {

namespace fs = std::filesystem;

namespace {

// The formats sdtrain reads, told apart by their signatures, and only these reach a decoder (libjpeg-turbo for JPEG,
// libwebp for WebP, stb for PNG and BMP): stb would also try GIF, PSD, PIC, PNM, HDR and TGA, and TGA has no
// signature, so damaged bytes could decode as a noise image and train silently.
enum class ImageFormat { kJpeg, kPng, kBmp, kWebp, kUnknown };

ImageFormat format_of(std::string_view bytes) {
  const auto starts_with = [&](std::string_view magic) { return bytes.substr(0, magic.size()) == magic; };
  if (starts_with("\xFF\xD8")) return ImageFormat::kJpeg;
  if (starts_with("\x89PNG\r\n\x1A\n")) return ImageFormat::kPng;
  if (starts_with("BM")) return ImageFormat::kBmp;
  if (bytes.size() >= 12 && starts_with("RIFF") && bytes.substr(8, 4) == "WEBP") return ImageFormat::kWebp;
  return ImageFormat::kUnknown;
}

RgbImage decode_webp(std::string_view bytes, const std::string& name) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  int width = 0, height = 0;
  SD_CHECK(WebPGetInfo(data, bytes.size(), &width, &height) != 0, "{}: cannot decode image (corrupt WebP data)", name);
  check_image_pixels(width, height, name);
  RgbImage image{width, height, std::vector<uint8_t>(static_cast<size_t>(width) * height * 3)};
  SD_CHECK(WebPDecodeRGBInto(data, bytes.size(), image.pixels.data(), image.pixels.size(), width * 3) != nullptr,
           "{}: cannot decode image (corrupt WebP data)", name);
  return image;
}

RgbImage decode_with_stb(std::string_view bytes, const std::string& name) {
  SD_CHECK(bytes.size() <= static_cast<size_t>(INT_MAX), "{}: image data of {} bytes is too large", name, bytes.size());
  const auto* data = reinterpret_cast<const stbi_uc*>(bytes.data());
  const int length = static_cast<int>(bytes.size());
  int width = 0, height = 0, channels = 0;
  // The header alone first, so an absurd size is refused before any memory is spent on it.
  if (stbi_info_from_memory(data, length, &width, &height, &channels) != 0) check_image_pixels(width, height, name);
  uint8_t* pixels = stbi_load_from_memory(data, length, &width, &height, &channels, 3);
  SD_CHECK(pixels != nullptr, "{}: cannot decode image ({}); expected a valid PNG or BMP file", name,
           stbi_failure_reason() ? stbi_failure_reason() : "unknown reason");
  RgbImage image{width, height, std::vector<uint8_t>(pixels, pixels + static_cast<size_t>(width) * height * 3)};
  stbi_image_free(pixels);
  return image;
}

}  // namespace

void check_image_pixels(int width, int height, const std::string& name) {
  SD_CHECK(static_cast<uint64_t>(width) * static_cast<uint64_t>(height) <= kMaxImagePixels,
           "{}: image of {}x{} pixels; expected at most {} pixels (PIL's decompression-bomb limit)", name, width,
           height, kMaxImagePixels);
}

RgbImage decode_image_rgb(std::string_view bytes, const std::string& name) {
  const ImageFormat format = format_of(bytes);
  SD_CHECK(format != ImageFormat::kUnknown,
           "{}: cannot decode image (unknown format); expected a JPEG, PNG, BMP or WebP file", name);
  switch (format) {
    case ImageFormat::kJpeg: return decode_jpeg(bytes, name);
    case ImageFormat::kWebp: return decode_webp(bytes, name);
    default: return decode_with_stb(bytes, name);
  }
}

std::optional<std::pair<int, int>> image_size(std::string_view head) {
  int width = 0, height = 0, channels = 0;
  const auto* data = reinterpret_cast<const uint8_t*>(head.data());
  bool known = false;
  switch (format_of(head)) {
    case ImageFormat::kUnknown: break;
    case ImageFormat::kJpeg: return jpeg_size(head);
    case ImageFormat::kWebp: known = WebPGetInfo(data, head.size(), &width, &height) != 0; break;
    default:
      known = head.size() <= static_cast<size_t>(INT_MAX) &&
              stbi_info_from_memory(data, static_cast<int>(head.size()), &width, &height, &channels) != 0;
  }
  if (!known || width <= 0 || height <= 0) return std::nullopt;
  return std::make_pair(width, height);
}

RgbImage load_image_rgb(const fs::path& path) {
  SD_CHECK(fs::exists(path), "{}: image file not found", path.string());
  std::ifstream file(path, std::ios::binary);
  SD_CHECK(file.is_open(), "{}: cannot open the image file", path.string());
  const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  SD_CHECK(!file.bad(), "{}: cannot read the image file", path.string());
  return decode_image_rgb(bytes, path.string());
}

RgbImage center_crop_square(const RgbImage& image) {
  const int side = std::min(image.width, image.height);
  const int top = (image.height - side) / 2;
  const int left = (image.width - side) / 2;
  return crop(image, top, left, side, side);
}

namespace {

// PIL's fixed-point resampling: coefficients carry 32 - 8 - 2 = 22 fractional bits.
constexpr int kPrecisionBits = 22;

// PIL's resampling filters: the kernel and its support at scale 1.
struct Filter {
  double (*kernel)(double);
  double support;
};

double bicubic_kernel(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

double bilinear_kernel(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

double sinc(double x) {
  if (x == 0.0) return 1.0;
  x *= M_PI;
  return std::sin(x) / x;
}

// The sinc windowed by a 3-lobe sinc.
double lanczos_kernel(double x) { return -3.0 <= x && x < 3.0 ? sinc(x) * sinc(x / 3) : 0.0; }

// The unit box, closed on the right as PIL's: at a downscale it averages the inputs an output covers.
double box_kernel(double x) { return x > -0.5 && x <= 0.5 ? 1.0 : 0.0; }

// The sinc windowed by a Hamming window over one lobe. PIL writes the window's constants as float literals, so
// they are float's nearest values of 0.54 and 0.46, not double's.
double hamming_kernel(double x) {
  x = std::fabs(x);
  if (x == 0.0) return 1.0;
  if (x >= 1.0) return 0.0;
  x *= M_PI;
  return std::sin(x) / x * (0.54f + 0.46f * std::cos(x));
}

constexpr Filter kBicubic{bicubic_kernel, 2.0};
constexpr Filter kBilinear{bilinear_kernel, 1.0};
constexpr Filter kLanczos{lanczos_kernel, 3.0};
constexpr Filter kBox{box_kernel, 0.5};
constexpr Filter kHamming{hamming_kernel, 1.0};

// For every output position: the first input index, the number of inputs it reads and their fixed-point weights
// (`taps` per output, the unused tail zero), laid out flat so the passes below read them in order.
struct Coefficients {
  int taps = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;  // output position x taps

  const int32_t* of(int position) const { return weights.data() + static_cast<size_t>(position) * taps; }
};

Coefficients resample_coefficients(int in_size, int out_size, const Filter& filter) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter.support * filter_scale;
  Coefficients c;
  c.taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.weights.assign(static_cast<size_t>(out_size) * c.taps, 0);
  std::vector<double> w(c.taps);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const int xmin = std::max(static_cast<int>(center - support + 0.5), 0);
    const int xmax = std::min(static_cast<int>(center + support + 0.5), in_size);
    double total = 0.0;
    for (int x = xmin; x < xmax; ++x) total += w[x - xmin] = filter.kernel((x - center + 0.5) / filter_scale);
    int32_t* fixed = c.weights.data() + static_cast<size_t>(xx) * c.taps;
    for (int k = 0; k < xmax - xmin; ++k) {
      const double normalized = total != 0.0 ? w[k] / total : w[k];
      const double scaled = normalized * (1 << kPrecisionBits);
      fixed[k] = static_cast<int32_t>(scaled < 0 ? scaled - 0.5 : scaled + 0.5);
    }
    c.first.push_back(xmin);
    c.count.push_back(xmax - xmin);
  }
  return c;
}

// 32-bit accumulators as PIL's: 255 x the weights' absolute sum (at most ~1.3 x 2^22 for lanczos) stays far
// below 2^31.
constexpr int32_t kRoundingBias = 1 << (kPrecisionBits - 1);

uint8_t clip8(int32_t accumulator) { return static_cast<uint8_t>(std::clamp(accumulator >> kPrecisionBits, 0, 255)); }

RgbImage resample_horizontal(const RgbImage& in, int out_width, const Filter& filter) {
  const Coefficients c = resample_coefficients(in.width, out_width, filter);
  RgbImage out{out_width, in.height, std::vector<uint8_t>(static_cast<size_t>(out_width) * in.height * 3)};
  for (int y = 0; y < in.height; ++y) {
    uint8_t* out_row = out.row(y);
    for (int x = 0; x < out_width; ++x) {
      const uint8_t* pixel = in.row(y) + static_cast<size_t>(c.first[x]) * 3;
      const int32_t* w = c.of(x);
      int32_t r = kRoundingBias, g = kRoundingBias, b = kRoundingBias;
      for (int k = 0; k < c.count[x]; ++k, pixel += 3) {
        r += pixel[0] * w[k];
        g += pixel[1] * w[k];
        b += pixel[2] * w[k];
      }
      out_row[x * 3] = clip8(r);
      out_row[x * 3 + 1] = clip8(g);
      out_row[x * 3 + 2] = clip8(b);
    }
  }
  return out;
}

// Row by row: each input row the output row reads is added, scaled, into a row of accumulators (a loop over
// contiguous bytes the compiler vectorises).
RgbImage resample_vertical(const RgbImage& in, int out_height, const Filter& filter) {
  const Coefficients c = resample_coefficients(in.height, out_height, filter);
  RgbImage out{in.width, out_height, std::vector<uint8_t>(static_cast<size_t>(in.width) * out_height * 3)};
  const size_t row_bytes = static_cast<size_t>(in.width) * 3;
  std::vector<int32_t> accumulators(row_bytes);
  for (int y = 0; y < out_height; ++y) {
    std::fill(accumulators.begin(), accumulators.end(), kRoundingBias);
    const int32_t* w = c.of(y);
    for (int k = 0; k < c.count[y]; ++k) {
      const uint8_t* in_row = in.row(c.first[y] + k);
      for (size_t x = 0; x < row_bytes; ++x) accumulators[x] += in_row[x] * w[k];
    }
    uint8_t* out_row = out.row(y);
    for (size_t x = 0; x < row_bytes; ++x) out_row[x] = clip8(accumulators[x]);
  }
  return out;
}

RgbImage resize_with(const RgbImage& image, int width, int height, const Filter& filter) {
  SD_CHECK(width > 0 && height > 0, "cannot resize an image to {}x{}", width, height);
  RgbImage out = image;
  // PIL skips a pass whose size does not change.
  if (width != out.width) out = resample_horizontal(out, width, filter);
  if (height != out.height) out = resample_vertical(out, height, filter);
  return out;
}

// PIL's nearest resize (ImagingScaleAffine): output column x reads input column floor(position), the position
// starting at half a step and advanced by adding the step (in / out) once per column, as PIL does; the sum's
// rounding differs from (x + 0.5) * step at some sizes (2 -> 7 reads column 0, not 1, for output 3). Rows likewise.
std::vector<int> nearest_sources(int in_size, int out_size) {
  const double step = static_cast<double>(in_size) / out_size;
  std::vector<int> sources(out_size);
  double position = step * 0.5;
  for (int& source : sources) {
    source = static_cast<int>(position);
    position += step;
  }
  return sources;
}

RgbImage resize_nearest(const RgbImage& image, int width, int height) {
  SD_CHECK(width > 0 && height > 0, "cannot resize an image to {}x{}", width, height);
  const std::vector<int> columns = nearest_sources(image.width, width);
  const std::vector<int> rows = nearest_sources(image.height, height);
  RgbImage out{width, height, std::vector<uint8_t>(static_cast<size_t>(width) * height * 3)};
  for (int y = 0; y < height; ++y) {
    // A sum that reaches the input's size (rounding over tens of millions of steps) reads nothing: PIL leaves
    // such pixels black.
    if (rows[y] >= image.height) continue;
    const uint8_t* in_row = image.row(rows[y]);
    uint8_t* out_row = out.row(y);
    for (int x = 0; x < width; ++x)
      if (columns[x] < image.width) std::copy_n(in_row + columns[x] * 3, 3, out_row + x * 3);
  }
  return out;
}

// torchvision's InterpolationMode names; on a PIL image its NEAREST_EXACT is PIL's NEAREST too.
constexpr std::pair<const char*, ResizeFilter> kResizeFilterNames[] = {
    {"bilinear", ResizeFilter::kBilinear},    {"bicubic", ResizeFilter::kBicubic},
    {"lanczos", ResizeFilter::kLanczos},      {"box", ResizeFilter::kBox},
    {"hamming", ResizeFilter::kHamming},      {"nearest", ResizeFilter::kNearest},
    {"nearest_exact", ResizeFilter::kNearest}};

}  // namespace

std::optional<ResizeFilter> resize_filter_named(const std::string& name) {
  for (const auto& [known, filter] : kResizeFilterNames)
    if (name == known) return filter;
  return std::nullopt;
}

std::string resize_filter_name(ResizeFilter filter) {
  for (const auto& [name, known] : kResizeFilterNames)
    if (filter == known) return name;
  fail("unknown resize filter");
}

RgbImage resize(const RgbImage& image, int width, int height, ResizeFilter filter) {
  switch (filter) {
    case ResizeFilter::kBilinear: return resize_with(image, width, height, kBilinear);
    case ResizeFilter::kBicubic: return resize_with(image, width, height, kBicubic);
    case ResizeFilter::kLanczos: return resize_with(image, width, height, kLanczos);
    case ResizeFilter::kBox: return resize_with(image, width, height, kBox);
    case ResizeFilter::kHamming: return resize_with(image, width, height, kHamming);
    case ResizeFilter::kNearest: return resize_nearest(image, width, height);
  }
  fail("unknown resize filter");
}

RgbImage crop(const RgbImage& image, int top, int left, int height, int width) {
  SD_CHECK(
      top >= 0 && left >= 0 && height > 0 && width > 0 && top + height <= image.height && left + width <= image.width,
      "crop {}x{} at ({}, {}) lies outside a {}x{} image", width, height, left, top, image.width, image.height);
  RgbImage out{width, height, std::vector<uint8_t>(static_cast<size_t>(width) * height * 3)};
  for (int y = 0; y < height; ++y) std::copy_n(image.row(top + y) + left * 3, width * 3, out.row(y));
  return out;
}

RgbImage flip_horizontal(const RgbImage& image) {
  RgbImage out = image;
  for (int y = 0; y < image.height; ++y)
    for (int x = 0; x < image.width; ++x) std::copy_n(image.row(y) + (image.width - 1 - x) * 3, 3, out.row(y) + x * 3);
  return out;
}

std::string encode_png(const RgbImage& image) {
  std::string png;
  auto append = [](void* context, void* data, int size) {
    static_cast<std::string*>(context)->append(static_cast<const char*>(data), size);
  };
  SD_CHECK(stbi_write_png_to_func(append, &png, image.width, image.height, 3, image.pixels.data(), image.width * 3),
           "could not PNG-encode a {}x{} image", image.width, image.height);
  return png;
}

void save_png(const fs::path& path, const RgbImage& image) {
  const std::string png = encode_png(image);
  write_file_atomically(path, [&](FileWriter& out) { out.write(png); });
}

}  // namespace sd::io
