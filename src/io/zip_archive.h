// Reading the zip archives torch.save writes (one stored, uncompressed entry per record; ZIP64 records once the
// file passes 4 GiB). The central directory is parsed with every offset and size checked against the file, so a
// truncated or forged archive fails with one line before any entry is used.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "io/random_access_file.h"

namespace sd::io {

class ZipArchive {
 public:
  struct Entry {
    std::string name;
    uint64_t data_offset = 0;  // of the entry's bytes in the file
    uint64_t size = 0;
    uint32_t crc32 = 0;
  };

  // Throws sd::Error naming the file for anything but a well-formed archive of stored entries.
  explicit ZipArchive(std::filesystem::path path);

  const std::filesystem::path& path() const { return file_.path(); }
  // Entries in central-directory order.
  const std::vector<Entry>& entries() const { return entries_; }
  // nullptr when absent.
  const Entry* find(const std::string& name) const;
  // The whole entry, its CRC-32 checked.
  std::string read(const Entry& entry) const;
  // `size` bytes from `offset` within the entry into dst; the CRC-32 is checked when the range is the whole entry.
  void read(const Entry& entry, uint64_t offset, uint64_t size, void* dst) const;

 private:
  uint64_t find_end_of_central_directory() const;
  void read_central_directory(uint64_t eocd_offset);
  void locate_data(Entry& entry, uint64_t local_header_offset, uint64_t central_directory_offset) const;

  RandomAccessFile file_;
  std::vector<Entry> entries_;
  std::map<std::string, size_t> by_name_;
};

}  // namespace sd::io
