// Reads the regular files of a tar archive one after another without extracting anything, as WebDataset shards
// are read: POSIX ustar, GNU (long names, base-256 sizes) and pax (path and size records) headers.
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

struct TarMember {
  std::string name;  // the path inside the archive, e.g. "part-00/000123.jpg"
  std::string data;  // its contents
};

class TarReader {
 public:
  // Members larger than this are skipped with a warning rather than read into memory.
  static constexpr uint64_t kDefaultMaxMemberBytes = uint64_t{1} << 30;

  // Throws sd::Error naming `path` if it cannot be opened or is not a tar archive.
  explicit TarReader(const std::filesystem::path& path, uint64_t max_member_bytes = kDefaultMaxMemberBytes);

  // The next regular file; nullopt once the archive (or its readable part) has ended. Directories, links and
  // other special members are passed over.
  std::optional<TarMember> next();

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
  uint64_t max_member_bytes_;
  bool ended_ = false;
  std::vector<std::string> warnings_;
};

}  // namespace sd::io
