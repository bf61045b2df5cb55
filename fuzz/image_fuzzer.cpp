// The image decoders (libjpeg-turbo for JPEG, stb for PNG and BMP, libwebp for WebP) on arbitrary bytes, plus the
// header-only size probe the bucketing uses. stb is compiled in instrumented (stb_image.cpp); the two libraries are
// Debian's, uninstrumented, so only their callers' handling of what they return is checked.
#include "fuzz_util.h"
#include "io/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  return sd::fuzz::run_one([&] {
    sd::io::image_size(bytes);
    sd::io::decode_image_rgb(bytes, "input");
  });
}
