// A read-only file read at explicit offsets (pread), so tensors are copied straight from the file into their own
// storage, and several readers can share one open file.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

namespace sd::io {

class RandomAccessFile {
 public:
  // Throws sd::Error naming the path if it cannot be opened.
  explicit RandomAccessFile(std::filesystem::path path);
  ~RandomAccessFile();
  RandomAccessFile(const RandomAccessFile&) = delete;
  RandomAccessFile& operator=(const RandomAccessFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  uint64_t size() const { return size_; }
  // Reads exactly `size` bytes at `offset`; a range past the end throws sd::Error naming the file.
  void read(void* dst, uint64_t size, uint64_t offset) const;
  std::string read(uint64_t size, uint64_t offset) const;

 private:
  void check_range(uint64_t size, uint64_t offset) const;

  std::filesystem::path path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

}  // namespace sd::io
