#include "io/random_access_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace sd::io {

RandomAccessFile::RandomAccessFile(std::filesystem::path path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  SD_CHECK(fd_ >= 0, "{}: cannot open ({})", path_.string(), std::strerror(errno));
  struct stat st {};
  const bool stat_ok = fstat(fd_, &st) == 0;
  const int error = errno;
  if (!stat_ok || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fail("{}: cannot read ({})", path_.string(), stat_ok ? "not a regular file" : std::strerror(error));
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

RandomAccessFile::~RandomAccessFile() { ::close(fd_); }

void RandomAccessFile::check_range(uint64_t size, uint64_t offset) const {
  SD_CHECK(offset <= size_ && size <= size_ - offset, "{}: truncated file: {} bytes needed at byte {}, the file has {}",
           path_.string(), size, offset, size_);
}

void RandomAccessFile::read(void* dst, uint64_t size, uint64_t offset) const {
  check_range(size, offset);
  auto* out = static_cast<char*>(dst);
  while (size > 0) {
    const ssize_t got = pread(fd_, out, size, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    SD_CHECK(got > 0, "{}: read failed at byte {} ({})", path_.string(), offset,
             got == 0 ? "unexpected end of file" : std::strerror(errno));
    out += got;
    size -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

std::string RandomAccessFile::read(uint64_t size, uint64_t offset) const {
  check_range(size, offset);  // before allocating for it
  std::string bytes(size, '\0');
  read(bytes.data(), size, offset);
  return bytes;
}

std::shared_ptr<std::byte> RandomAccessFile::map(uint64_t size, uint64_t offset) const {
  check_range(size, offset);
  SD_CHECK(size > 0, "{}: cannot map 0 bytes", path_.string());
  static const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t first = offset / page * page, length = offset + size - first;
  void* pages = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd_, static_cast<off_t>(first));
  if (pages == MAP_FAILED) return nullptr;
  // Not MAP_POPULATE: on a writable private mapping it faults pages in for writing, copying each. This maps the page
  // cache's pages read-only in one call (Linux >= 5.14; older kernels refuse it and fault pages in as they are read).
  madvise(pages, length, MADV_POPULATE_READ);
  return {static_cast<std::byte*>(pages) + (offset - first), [pages, length](std::byte*) { munmap(pages, length); }};
}

}  // namespace sd::io
