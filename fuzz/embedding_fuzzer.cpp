// Textual-inversion embedding files (diffusers' learned_embeds safetensors / .bin, A1111's .pt and .safetensors) on
// arbitrary bytes.
#include "fuzz_util.h"
#include "pipeline/embedding_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The name's extension does not decide the format (the first bytes do); .pt is what A1111 writes.
  const auto path = sd::fuzz::write_input({reinterpret_cast<const char*>(data), size}, "embedding.pt");
  return sd::fuzz::run_one([&] { sd::pipeline::load_embedding_file(path); });
}
