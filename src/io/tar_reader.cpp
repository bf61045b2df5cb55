#include "io/tar_reader.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <string_view>

#include "core/error.h"

namespace sd::io {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kBlockSize = 512;
using Block = std::array<char, kBlockSize>;

// Where the ustar header keeps each field (offset, length).
struct Field {
  size_t offset;
  size_t length;
};
constexpr Field kName{0, 100}, kSize{124, 12}, kChecksum{148, 8}, kTypeflag{156, 1}, kMagic{257, 8}, kPrefix{345, 155};

std::string_view field(const Block& block, Field f) { return std::string_view(block.data() + f.offset, f.length); }

// A NUL-padded text field up to its first NUL.
std::string_view text_field(const Block& block, Field f) {
  std::string_view s = field(block, f);
  return s.substr(0, std::min(s.find('\0'), s.size()));
}

bool is_zero_block(const Block& block) {
  return std::all_of(block.begin(), block.end(), [](char c) { return c == 0; });
}

// Octal digits, optionally led by spaces and ended by spaces or NULs, as tar writes numbers. A field with no
// digits at all is 0 (Python's tarfile reads it so; some writers leave sizes of directories empty).
std::optional<uint64_t> parse_octal(std::string_view s) {
  size_t i = std::min(s.find_first_not_of(' '), s.size());
  uint64_t value = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '7'; ++i) {
    if (value > (UINT64_MAX >> 3)) return std::nullopt;
    value = value * 8 + static_cast<uint64_t>(s[i] - '0');
  }
  const bool only_padding_left = s.find_first_not_of(std::string_view(" \0", 2), i) == std::string_view::npos;
  if (!only_padding_left) return std::nullopt;
  return value;
}

// GNU tar writes sizes of 8 GiB and more in base 256: high bit of the first byte set, then big-endian bytes.
std::optional<uint64_t> parse_size(std::string_view s) {
  const auto first = static_cast<unsigned char>(s[0]);
  if (first == 0x80) {
    uint64_t value = 0;
    for (size_t i = 1; i < s.size(); ++i) {
      if (value > (UINT64_MAX >> 8)) return std::nullopt;
      value = (value << 8) | static_cast<unsigned char>(s[i]);
    }
    return value;
  }
  return parse_octal(s);
}

// The header checksum is the sum of its bytes with the checksum field taken as spaces. Some old writers summed
// signed chars; tar readers accept either.
bool checksum_matches(const Block& block) {
  const std::optional<uint64_t> stored = parse_octal(field(block, kChecksum));
  if (!stored) return false;
  int64_t unsigned_sum = 0, signed_sum = 0;
  for (size_t i = 0; i < kBlockSize; ++i) {
    const bool in_checksum = i >= kChecksum.offset && i < kChecksum.offset + kChecksum.length;
    const char c = in_checksum ? ' ' : block[i];
    unsigned_sum += static_cast<unsigned char>(c);
    signed_sum += static_cast<signed char>(c);
  }
  return static_cast<int64_t>(*stored) == unsigned_sum || static_cast<int64_t>(*stored) == signed_sum;
}

// POSIX ustar splits long paths into prefix + "/" + name; GNU tar ("ustar  ") uses that space for other fields.
std::string member_name(const Block& block) {
  const std::string_view name = text_field(block, kName);
  const std::string_view prefix = text_field(block, kPrefix);
  const bool posix = field(block, kMagic).substr(0, 6) == std::string_view("ustar\0", 6);
  if (posix && !prefix.empty()) return std::string(prefix) + "/" + std::string(name);
  return std::string(name);
}

std::optional<uint64_t> parse_decimal(std::string_view s) {
  if (s.empty()) return std::nullopt;
  uint64_t value = 0;
  for (char c : s) {
    if (c < '0' || c > '9' || value > (UINT64_MAX - 9) / 10) return std::nullopt;
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  return value;
}

uint64_t round_up_to_block(uint64_t size) { return (size + kBlockSize - 1) / kBlockSize * kBlockSize; }

// What GNU long-name ('L') and pax ('x') headers say about the member that follows them.
struct Overrides {
  std::optional<std::string> path;
  std::optional<uint64_t> size;  // pax writes sizes of 8 GiB and more here
};

// pax records are "LENGTH key=value\n", LENGTH counting the whole record in decimal.
void read_pax_records(std::string_view data, Overrides& overrides) {
  while (!data.empty()) {
    const size_t space = data.find(' ');
    if (space == std::string_view::npos) return;
    const std::optional<uint64_t> length = parse_decimal(data.substr(0, space));
    if (!length || *length < space + 2 || *length > data.size()) return;
    const std::string_view record = data.substr(space + 1, *length - space - 2);  // without the '\n'
    const size_t equals = record.find('=');
    if (equals != std::string_view::npos) {
      const std::string_view key = record.substr(0, equals), value = record.substr(equals + 1);
      if (key == "path") overrides.path = std::string(value);
      if (key == "size") overrides.size = parse_decimal(value);
    }
    data.remove_prefix(*length);
  }
}

enum class MemberKind { kFile, kGnuLongName, kPaxHeader, kOther };

MemberKind kind_of(char type_flag) {
  switch (type_flag) {
    case '0':
    case '\0':
    case '7': return MemberKind::kFile;  // '7', a contiguous file, is a regular file to every reader
    case 'L': return MemberKind::kGnuLongName;
    case 'x': return MemberKind::kPaxHeader;
    default: return MemberKind::kOther;  // directories, links, devices, pax global headers, GNU long link names
  }
}

}  // namespace

struct TarReader::Header {
  std::string name;
  char type;
  uint64_t size;
  uint64_t offset;  // of the header block, for messages
};

TarReader::TarReader(const fs::path& path) : path_(path), file_(path, std::ios::binary) {
  SD_CHECK(file_.is_open(), "{}: cannot open the tar archive", path.string());
  std::error_code ec;
  file_size_ = fs::file_size(path, ec);
  SD_CHECK(!ec, "{}: cannot read the tar archive's size ({})", path.string(), ec.message());
  SD_CHECK(file_size_ >= kBlockSize, "{}: not a tar archive ({} bytes, shorter than one 512-byte tar header)",
           path.string(), file_size_);
  Block first{};
  file_.read(first.data(), kBlockSize);
  SD_CHECK(file_.gcount() == static_cast<std::streamsize>(kBlockSize), "{}: cannot read the tar archive",
           path.string());
  SD_CHECK(!(first[0] == '\x1f' && first[1] == '\x8b'),
           "{}: is gzip-compressed; expected an uncompressed tar archive (gunzip it first)", path.string());
  SD_CHECK(is_zero_block(first) || checksum_matches(first),
           "{}: not a tar archive (its first 512 bytes are not a tar header)", path.string());
}

void TarReader::stop(const std::string& problem) {
  warnings_.push_back(fmt::format("{}: {}", path_.string(), problem));
  ended_ = true;
}

std::optional<TarReader::Header> TarReader::read_header() {
  if (offset_ == file_size_) {
    stop("ends without tar's end-of-archive blocks (truncated?)");
    return std::nullopt;
  }
  if (file_size_ - offset_ < kBlockSize) {
    stop(fmt::format("truncated tar header at offset {}", offset_));
    return std::nullopt;
  }
  Block block{};
  file_.seekg(static_cast<std::streamoff>(offset_));
  file_.read(block.data(), kBlockSize);
  if (file_.gcount() != static_cast<std::streamsize>(kBlockSize)) {
    stop(fmt::format("cannot read the tar header at offset {}", offset_));
    return std::nullopt;
  }
  if (is_zero_block(block)) {
    ended_ = true;  // end of archive
    return std::nullopt;
  }
  if (!checksum_matches(block)) {
    stop(fmt::format("bad tar header checksum at offset {} (corrupt archive); the rest of it is skipped", offset_));
    return std::nullopt;
  }
  Header header{member_name(block), field(block, kTypeflag)[0], 0, offset_};
  const std::optional<uint64_t> size = parse_size(field(block, kSize));
  if (!size) {
    stop(fmt::format("member '{}' at offset {}: unreadable size field", header.name, offset_));
    return std::nullopt;
  }
  header.size = *size;
  offset_ += kBlockSize;
  return header;
}

bool TarReader::read_data(uint64_t size, std::string& out) {
  out.resize(size);
  file_.seekg(static_cast<std::streamoff>(offset_));
  file_.read(out.data(), static_cast<std::streamsize>(size));
  if (file_.gcount() != static_cast<std::streamsize>(size)) return false;
  skip_data(size);
  return true;
}

void TarReader::skip_data(uint64_t size) {
  // next() checked size <= file_size_ - offset_, so this cannot overflow.
  offset_ = std::min(offset_ + round_up_to_block(size), file_size_);
}

std::optional<TarEntry> TarReader::next() {
  Overrides overrides;
  while (!ended_) {
    std::optional<Header> header = read_header();
    if (!header) return std::nullopt;
    if (overrides.path) header->name = *overrides.path;
    if (overrides.size) header->size = *overrides.size;
    if (header->size > file_size_ - offset_) {
      stop(fmt::format("member '{}' at offset {}: its {} bytes run past the end of the file (truncated archive)",
                       header->name, header->offset, header->size));
      return std::nullopt;
    }
    const MemberKind kind = kind_of(header->type);
    if (kind == MemberKind::kFile) {
      TarEntry entry{std::move(header->name), offset_, header->size};
      skip_data(entry.size);
      return entry;
    }
    const bool too_large = kind != MemberKind::kOther && header->size > kMaxRecordBytes;
    if (too_large)
      warnings_.push_back(fmt::format("{}: header record '{}' is {} bytes, more than the {} allowed; skipped",
                                      path_.string(), header->name, header->size, kMaxRecordBytes));
    if (kind == MemberKind::kOther || too_large) {
      skip_data(header->size);
      overrides = {};
      continue;
    }
    std::string data;
    if (!read_data(header->size, data)) {
      stop(fmt::format("member '{}' at offset {}: cannot read its data", header->name, header->offset));
      return std::nullopt;
    }
    if (kind == MemberKind::kGnuLongName) overrides.path = std::string(data.c_str());  // NUL-terminated
    if (kind == MemberKind::kPaxHeader) read_pax_records(data, overrides);
  }
  return std::nullopt;
}

std::string read_entry(const fs::path& path, const TarEntry& entry) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  SD_CHECK(fd >= 0, "{}: cannot open the tar archive ({}); was it moved or deleted since it was indexed?",
           path.string(), std::strerror(errno));
  std::string data(entry.size, '\0');
  uint64_t done = 0;
  while (done < entry.size) {
    const ssize_t got =
        ::pread(fd, data.data() + done, entry.size - done, static_cast<off_t>(entry.data_offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    done += static_cast<uint64_t>(got);
  }
  ::close(fd);
  SD_CHECK(done == entry.size,
           "{}: member '{}' ({} bytes at offset {}) can no longer be read; was the archive changed since it was "
           "indexed?",
           path.string(), entry.name, entry.size, entry.data_offset);
  return data;
}

}  // namespace sd::io
