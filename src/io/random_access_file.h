// A read-only file read at explicit offsets (pread) or mapped, so tensors are copied straight from the file into
// their own storage or alias its pages, and several readers can share one open file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
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
  // `size` (> 0) bytes at `offset` mapped copy-on-write (MAP_PRIVATE), unmapped when the last copy of the pointer
  // (to the byte at `offset`) goes. A tensor there shares the kernel's page cache instead of a copy in fresh memory,
  // which the kernel would first have to clear; writing to it copies only the pages written, never to the file or
  // another mapping. sdtrain replaces files by rename, never rewrites them in place (atomic_file.h), so a mapped
  // file's bytes do not change under the mapping. Null where the file system cannot map.
  std::shared_ptr<std::byte> map(uint64_t size, uint64_t offset) const;

 private:
  void check_range(uint64_t size, uint64_t offset) const;

  std::filesystem::path path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

}  // namespace sd::io
