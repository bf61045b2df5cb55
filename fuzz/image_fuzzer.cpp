// The image decoders (stb for JPEG, PNG, BMP; libwebp for WebP) on arbitrary bytes, plus the header-only size
// probe the bucketing uses.
#include "fuzz_util.h"
#include "io/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  return sd::fuzz::run_one([&] {
    sd::io::image_size(bytes);
    sd::io::decode_image_rgb(bytes, "input");
  });
}
