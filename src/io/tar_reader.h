// Lists the regular files of a tar archive without extracting anything, as WebDataset shards are indexed: each
// member's name and where its bytes lie, from the headers alone (the data between headers is seeked over, never
// read), so a member can later be read on its own with one pread. POSIX ustar, GNU (long names, base-256 sizes)
// and pax (path and size records) headers.
// Damage inside an archive is never fatal: a bad header checksum, a member whose size runs past the end of the
// file or a truncated header ends the archive early with a warning that names the archive, the offset and the
// member; only a file that is not a tar archive at all is an error.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace sd::io {

// A regular file of an archive: its name and where its bytes are.
struct TarEntry {
  std::string name;          // the path inside the archive, e.g. "part-00/000123.jpg"
  uint64_t data_offset = 0;  // of its first byte, from the start of the archive
  uint64_t size = 0;
};

class TarReader {
 public:
  // GNU long-name and pax records (metadata about the next member, read into memory) larger than this are
  // skipped with a warning: real ones are a few hundred bytes.
  static constexpr uint64_t kMaxRecordBytes = uint64_t{1} << 20;

  // Throws sd::Error naming `path` if it cannot be opened or is not a tar archive.
  explicit TarReader(const std::filesystem::path& path);

  // The next regular file; nullopt once the archive (or its readable part) has ended. Directories, links and
  // other special members are passed over.
  std::optional<TarEntry> next();

  const std::filesystem::path& path() const { return path_; }
  // One line per problem met so far, each naming the archive and where it went wrong.
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  struct Header;

  std::optional<Header> read_header();
  bool read_data(uint64_t size, std::string& out);
  void skip_data(uint64_t size);
  void stop(const std::string& problem);

  std::filesystem::path path_;
  std::ifstream file_;
  uint64_t file_size_ = 0;
  uint64_t offset_ = 0;  // where the next header starts
  bool ended_ = false;
  std::vector<std::string> warnings_;
};

// The bytes of `entry` (listed by a TarReader of the archive at `path`), read with one pread: safe on any thread,
// with no reader kept open. Throws sd::Error naming the archive if it cannot be opened or no longer holds them.
std::string read_entry(const std::filesystem::path& path, const TarEntry& entry);

}  // namespace sd::io
