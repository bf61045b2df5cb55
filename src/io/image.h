// Images as the training data and the generated outputs need them: decode (JPEG, PNG, BMP, WebP) to 8-bit RGB,
// PIL's center crop and antialiased bicubic, bilinear and Lanczos resize bit for bit, and PNG writing.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sd::io {

struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;  // row-major, 3 bytes (R, G, B) per pixel

  uint8_t* row(int y) { return pixels.data() + static_cast<size_t>(y) * width * 3; }
  const uint8_t* row(int y) const { return pixels.data() + static_cast<size_t>(y) * width * 3; }
};

// PIL's decompression-bomb limit (twice Image.MAX_IMAGE_PIXELS, where it stops warning and refuses).
constexpr uint64_t kMaxImagePixels = 2 * uint64_t{89'478'485};

// Throws sd::Error naming `name` if an image of width × height has more pixels than PIL would open.
void check_image_pixels(int width, int height, const std::string& name);

// Decodes an image held in memory (a JPEG, PNG, BMP or WebP file's bytes, e.g. a tar member) to RGB; an alpha
// channel is dropped without compositing (as PIL's convert("RGB")). Corrupt data, or an image of more pixels than
// PIL would open (kMaxImagePixels), throws sd::Error naming `name`.
RgbImage decode_image_rgb(std::string_view bytes, const std::string& name);

// An image's width and height from the start of its file (JPEG, PNG, BMP or WebP headers; a few KiB usually
// suffice), without decoding it; nullopt if `head` does not hold a readable header.
std::optional<std::pair<int, int>> image_size(std::string_view head);

// decode_image_rgb of a file's contents; a missing or unreadable file throws sd::Error naming it.
RgbImage load_image_rgb(const std::filesystem::path& path);

// The central square of side min(width, height), taken as textual_inversion.py does:
// rows (h - c) // 2 : (h + c) // 2 and columns likewise.
RgbImage center_crop_square(const RgbImage& image);

// PIL's Image.resize filters, by torchvision's InterpolationMode names (on a PIL image torchvision's Resize is PIL's
// resize with that filter).
enum class ResizeFilter {
  kBilinear,  // Image.BILINEAR: the triangle filter (support 1); train_text_to_image.py 0.24's Resize
  kBicubic,   // Image.BICUBIC: textual_inversion.py's resize
  kLanczos,   // Image.LANCZOS: the 3-lobe Lanczos filter (support 3); diffusers' VaeImageProcessor (img2img)
  kBox,       // Image.BOX: the unit box (support 1/2); an area average when downscaling
  kHamming,   // Image.HAMMING: a Hamming-windowed sinc (support 1)
  kNearest,   // Image.NEAREST: each output pixel copies one input pixel, no filtering
};

// "bilinear", "bicubic", "lanczos", "box", "hamming", "nearest" or "nearest_exact" (torchvision's names; on a PIL
// image nearest_exact is PIL's nearest); nullopt for any other name.
std::optional<ResizeFilter> resize_filter_named(const std::string& name);
// The first of those names that gives `filter`.
std::string resize_filter_name(ResizeFilter filter);

// PIL's Image.resize(size, filter) bit for bit. All but nearest: separable, antialiased (support scaled by the
// downscale factor), fixed-point with 22 fractional bits, horizontal pass first, each pass rounded and clamped to
// 0..255. Nearest: PIL's scale-only affine transform, positions summed step by step as PIL sums them.
RgbImage resize(const RgbImage& image, int width, int height, ResizeFilter filter);

// The height x width region whose top-left pixel is (left, top); throws sd::Error if it does not fit.
RgbImage crop(const RgbImage& image, int top, int left, int height, int width);

// Mirrors the image left-right.
RgbImage flip_horizontal(const RgbImage& image);

// Writes a PNG atomically.
void save_png(const std::filesystem::path& path, const RgbImage& image);
// The PNG file's bytes.
std::string encode_png(const RgbImage& image);

}  // namespace sd::io
