// The tar reader of WebDataset shards on arbitrary bytes: headers, checksums, base-256 and pax sizes, GNU long
// names, truncation; every member it lists is read back.
#include "fuzz_util.h"
#include "io/tar_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = sd::fuzz::write_input({reinterpret_cast<const char*>(data), size}, "shard.tar");
  return sd::fuzz::run_one([&] {
    sd::io::TarReader reader(path);
    while (auto entry = reader.next()) sd::io::read_entry(path, *entry);
  });
}
