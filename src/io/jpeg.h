// JPEG decoding (and encoding) through libjpeg-turbo, the library Pillow decodes with (Debian's 2.1.5 made the
// fixtures), so the pixels equal PIL's Image.open(...).convert("RGB") to the last bit. It replaced stb's JPEG decoder,
// which differs by a few levels and, in the version Debian ships, writes out of bounds on a malformed Huffman table.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "io/image.h"

namespace sd::io {

// The width and height in a JPEG's headers; nullopt if `head` ends before the first scan or the headers are corrupt.
std::optional<std::pair<int, int>> jpeg_size(std::string_view head);

// Decodes a JPEG file's bytes to RGB (grayscale replicated, CMYK converted as PIL converts it). Corrupt or truncated
// data (PIL refuses a truncated file too), or more pixels than kMaxImagePixels, throws sd::Error naming `name`.
RgbImage decode_jpeg(std::string_view bytes, const std::string& name);

// A baseline JPEG file of `image` as PIL's Image.save(..., "JPEG", quality=quality) writes it with libjpeg-turbo's
// defaults (4:2:0 chroma, standard tables scaled to the quality, a JFIF header of 1:1 density): the same bytes.
std::string encode_jpeg(const RgbImage& image, int quality = 75);

}  // namespace sd::io
