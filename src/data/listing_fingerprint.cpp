#include "data/listing_fingerprint.h"

#include <fmt/format.h>

#include <cstdint>
#include <system_error>

namespace sd::data {

namespace {

void mix(uint64_t& hash, const std::string& text) {
  for (const unsigned char c : text) {
    hash ^= c;
    hash *= 0x100000001b3ull;  // FNV-1a's 64-bit prime
  }
}

}  // namespace

std::string listing_fingerprint(const std::vector<std::filesystem::path>& files) {
  std::vector<std::string> items;
  for (const auto& file : files) {
    std::error_code error;
    const uintmax_t size = std::filesystem::file_size(file, error);
    items.push_back(fmt::format("{}\n{}", file.filename().string(), error ? 0 : size));
  }
  return text_fingerprint(items);
}

std::string text_fingerprint(const std::vector<std::string>& items) {
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a's 64-bit offset basis
  for (const std::string& item : items) {
    mix(hash, item);
    mix(hash, "\n");
  }
  return fmt::format("{:016x}", hash);
}

}  // namespace sd::data
