// The safetensors reader on arbitrary bytes: header parsing, offsets, sizes, then reading every tensor it accepts.
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = sd::fuzz::write_input({reinterpret_cast<const char*>(data), size});
  return sd::fuzz::run_one([&] {
    sd::io::SafeTensorsFile file(path);
    for (const auto& name : file.names()) file.read(name);
  });
}
