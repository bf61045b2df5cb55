// Builds tar archives byte by byte for the tests, so they can also hold the damage real shards suffer
// (bad checksums, truncation, sizes past the end).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

namespace sd::test {

class TarBuilder {
 public:
  // A ustar header for `name` (split into prefix/name when longer than 100 bytes) and the data, padded to 512.
  TarBuilder& file(const std::string& name, const std::string& data, char type = '0');
  // Raw bytes, e.g. a hand-made header.
  TarBuilder& raw(const std::string& bytes);
  // The two zero blocks that end an archive.
  TarBuilder& end();

  const std::string& bytes() const { return bytes_; }
  void write(const std::filesystem::path& path) const;

  // A header block alone; `size` is what the header claims, whatever follows it.
  static std::string header(const std::string& name, uint64_t size, char type = '0');

 private:
  std::string bytes_;
};

}  // namespace sd::test
