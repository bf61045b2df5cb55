#include "io/tar_builder.h"

#include <fmt/format.h>

#include <fstream>

namespace sd::test {

namespace {

// Writes `text` over block[offset...] (the field's remaining bytes stay NUL).
void put(std::string& block, size_t offset, const std::string& text) { block.replace(offset, text.size(), text); }

}  // namespace

std::string TarBuilder::header(const std::string& name, uint64_t size, char type) {
  std::string block(512, '\0');
  std::string prefix, base = name;
  if (name.size() > 100) {  // ustar: split at a '/' so the rest fits the 100-byte name field
    const size_t slash = name.rfind('/');
    prefix = name.substr(0, slash);
    base = name.substr(slash + 1);
  }
  put(block, 0, base);
  put(block, 100, "0000644");
  put(block, 124, fmt::format("{:011o}", size));
  put(block, 136, "14000000000");
  block[156] = type;
  put(block, 257,
      std::string("ustar\0"
                  "00",
                  8));
  put(block, 345, prefix);
  put(block, 148, "        ");  // the checksum counts its own field as spaces
  unsigned sum = 0;
  for (char c : block) sum += static_cast<unsigned char>(c);
  put(block, 148, fmt::format("{:06o}", sum) + std::string("\0 ", 2));
  return block;
}

TarBuilder& TarBuilder::file(const std::string& name, const std::string& data, char type) {
  bytes_ += header(name, data.size(), type) + data;
  bytes_.append((512 - data.size() % 512) % 512, '\0');
  return *this;
}

TarBuilder& TarBuilder::raw(const std::string& bytes) {
  bytes_ += bytes;
  return *this;
}

TarBuilder& TarBuilder::end() {
  bytes_.append(1024, '\0');
  return *this;
}

void TarBuilder::write(const std::filesystem::path& path) const { std::ofstream(path, std::ios::binary) << bytes_; }

}  // namespace sd::test
