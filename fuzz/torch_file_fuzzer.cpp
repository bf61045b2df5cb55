// torch.save files (.bin / .pt / .ckpt: a zip archive around a pickle) on arbitrary bytes: the zip directory, the
// restricted unpickler, the tensor views, then reading every tensor; also the sharded-index and format sniffing
// of open_tensor_file.
#include "fuzz_util.h"
#include "io/tensor_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = sd::fuzz::write_input({reinterpret_cast<const char*>(data), size}, "input.bin");
  return sd::fuzz::run_one([&] {
    auto file = sd::io::open_tensor_file(path);
    for (const auto& name : file->names()) {
      file->info(name);
      file->read(name);
    }
  });
}
