#include "io/zip_archive.h"

#include <zlib.h>

#include <algorithm>

#include "core/error.h"
#include "io/byte_reader.h"

namespace sd::io {

namespace {

// Record signatures and sizes of the zip format (PKWARE APPNOTE 6.3).
constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEndOfCentralDirectory = 0x06054b50;
constexpr uint32_t kZip64EndLocator = 0x07064b50;
constexpr uint32_t kZip64End = 0x06064b50;
constexpr uint64_t kEndRecordSize = 22;
constexpr uint64_t kZip64LocatorSize = 20;
constexpr uint64_t kZip64EndSize = 56;
constexpr uint64_t kLocalHeaderSize = 30;
constexpr uint64_t kMaxCommentSize = 0xFFFF;
constexpr uint16_t kZip64ExtraId = 0x0001;
constexpr uint32_t kUnknown32 = 0xFFFFFFFF;  // "the value is in the ZIP64 record"

// A whole-file position check that cannot overflow: [offset, offset + size) lies within [0, limit).
bool within(uint64_t offset, uint64_t size, uint64_t limit) { return offset <= limit && size <= limit - offset; }

uint32_t crc32_of(const void* data, uint64_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* bytes = static_cast<const Bytef*>(data);
  while (size > 0) {  // zlib takes 32-bit lengths
    const auto chunk = static_cast<uInt>(std::min<uint64_t>(size, 1u << 30));
    crc = crc32(crc, bytes, chunk);
    bytes += chunk;
    size -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

struct CentralDirectory {
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t entries = 0;
};

// The 64-bit sizes and offset a ZIP64 extra field carries for the 32-bit fields that hold 0xFFFFFFFF.
void read_zip64_extra(std::string_view extra, const std::string& what, uint64_t& size, uint64_t& compressed_size,
                      uint64_t& local_offset) {
  ByteReader fields(extra, what + " extra field");
  while (!fields.at_end()) {
    const uint16_t id = fields.u16();
    ByteReader body(fields.take(fields.u16()), what + " ZIP64 field");
    if (id != kZip64ExtraId) continue;
    if (size == kUnknown32) size = body.u64();
    if (compressed_size == kUnknown32) compressed_size = body.u64();
    if (local_offset == kUnknown32) local_offset = body.u64();
    return;
  }
}

}  // namespace

ZipArchive::ZipArchive(std::filesystem::path path) : file_(std::move(path)) {
  read_central_directory(find_end_of_central_directory());
}

// The end record is the last 22 bytes unless the archive has a comment; search back over the longest comment.
uint64_t ZipArchive::find_end_of_central_directory() const {
  const uint64_t size = file_.size();
  SD_CHECK(size >= kEndRecordSize, "{}: not a zip archive ({} bytes, too short)", path().string(), size);
  const uint64_t tail_start = size - std::min(size, kEndRecordSize + kMaxCommentSize);
  const std::string tail = file_.read(size - tail_start, tail_start);
  for (uint64_t pos = tail.size() - kEndRecordSize + 1; pos-- > 0;) {
    ByteReader record(std::string_view(tail).substr(pos), path().string());
    if (record.u32() != kEndOfCentralDirectory) continue;
    record.skip(16);
    if (record.u16() == record.remaining()) return tail_start + pos;  // the comment runs exactly to the end
  }
  fail("{}: not a zip archive (no end-of-central-directory record; truncated or not written by torch.save)",
       path().string());
}

void ZipArchive::read_central_directory(uint64_t eocd_offset) {
  const std::string name = path().string();
  const std::string end_bytes = file_.read(kEndRecordSize, eocd_offset);
  ByteReader end(end_bytes, name + ": end record");
  end.skip(4);
  const uint16_t disk = end.u16(), directory_disk = end.u16();
  end.skip(2);
  CentralDirectory dir{0, 0, end.u16()};
  dir.size = end.u32();
  dir.offset = end.u32();
  SD_CHECK(disk == 0 && directory_disk == 0, "{}: multi-volume zip archives are not supported", name);
  uint64_t directory_limit = eocd_offset;
  if (dir.entries == 0xFFFF || dir.size == kUnknown32 || dir.offset == kUnknown32) {
    SD_CHECK(eocd_offset >= kZip64LocatorSize, "{}: corrupt zip archive: ZIP64 locator missing", name);
    const std::string locator_bytes = file_.read(kZip64LocatorSize, eocd_offset - kZip64LocatorSize);
    ByteReader locator(locator_bytes, name + ": ZIP64 locator");
    SD_CHECK(locator.u32() == kZip64EndLocator, "{}: corrupt zip archive: ZIP64 locator missing", name);
    locator.skip(4);
    const uint64_t zip64_end = locator.u64();
    SD_CHECK(within(zip64_end, kZip64EndSize, eocd_offset - kZip64LocatorSize),
             "{}: corrupt zip archive: ZIP64 end record at byte {} lies outside the file", name, zip64_end);
    const std::string record_bytes = file_.read(kZip64EndSize, zip64_end);
    ByteReader record(record_bytes, name + ": ZIP64 end record");
    SD_CHECK(record.u32() == kZip64End, "{}: corrupt zip archive: bad ZIP64 end record signature", name);
    record.skip(28);
    dir.entries = record.u64();
    dir.size = record.u64();
    dir.offset = record.u64();
    directory_limit = zip64_end;
  }
  SD_CHECK(within(dir.offset, dir.size, directory_limit),
           "{}: corrupt or truncated zip archive: central directory (byte {}, {} bytes) lies outside the file", name,
           dir.offset, dir.size);
  const std::string directory = file_.read(dir.size, dir.offset);
  ByteReader records(directory, name + ": central directory");
  for (uint64_t i = 0; i < dir.entries; ++i) {
    SD_CHECK(records.u32() == kCentralHeader, "{}: corrupt zip archive: bad central directory record {}", name, i);
    records.skip(4);
    const uint16_t flags = records.u16(), method = records.u16();
    records.skip(4);
    Entry entry;
    entry.crc32 = records.u32();
    uint64_t compressed_size = records.u32();
    entry.size = records.u32();
    const uint16_t name_length = records.u16(), extra_length = records.u16(), comment_length = records.u16();
    records.skip(8);
    uint64_t local_offset = records.u32();
    entry.name = std::string(records.take(name_length));
    read_zip64_extra(records.take(extra_length), name + ": entry " + entry.name, entry.size, compressed_size,
                     local_offset);
    records.skip(comment_length);
    SD_CHECK(!(flags & 1), "{}: entry '{}' is encrypted", name, entry.name);
    SD_CHECK(method == 0 && compressed_size == entry.size,
             "{}: entry '{}' is compressed (method {}); torch.save stores entries uncompressed — re-save the file with "
             "torch.save",
             name, entry.name, method);
    locate_data(entry, local_offset, dir.offset);
    SD_CHECK(by_name_.emplace(entry.name, entries_.size()).second, "{}: corrupt zip archive: entry '{}' appears twice",
             name, entry.name);
    entries_.push_back(std::move(entry));
  }
}

// An entry's bytes follow its local header, whose name and extra field lengths may differ from the central ones.
void ZipArchive::locate_data(Entry& entry, uint64_t local_header_offset, uint64_t central_directory_offset) const {
  const std::string name = path().string();
  SD_CHECK(within(local_header_offset, kLocalHeaderSize, central_directory_offset),
           "{}: corrupt zip archive: entry '{}' has its header at byte {}, outside the file's entries", name,
           entry.name, local_header_offset);
  const std::string header_bytes = file_.read(kLocalHeaderSize, local_header_offset);
  ByteReader header(header_bytes, name + ": local header of " + entry.name);
  SD_CHECK(header.u32() == kLocalHeader, "{}: corrupt zip archive: bad local header for entry '{}'", name, entry.name);
  header.skip(22);
  const uint64_t name_length = header.u16(), extra_length = header.u16();
  entry.data_offset = local_header_offset + kLocalHeaderSize + name_length + extra_length;
  SD_CHECK(within(entry.data_offset, entry.size, central_directory_offset),
           "{}: corrupt or truncated zip archive: entry '{}' ({} bytes at byte {}) runs past the archive's data", name,
           entry.name, entry.size, entry.data_offset);
}

const ZipArchive::Entry* ZipArchive::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

std::string ZipArchive::read(const Entry& entry) const {
  std::string bytes(entry.size, '\0');
  read(entry, 0, entry.size, bytes.data());
  return bytes;
}

void ZipArchive::read(const Entry& entry, uint64_t offset, uint64_t size, void* dst) const {
  SD_CHECK(within(offset, size, entry.size), "{}: entry '{}' has {} bytes; {} bytes at offset {} were asked for",
           path().string(), entry.name, entry.size, size, offset);
  file_.read(dst, size, entry.data_offset + offset);
  if (offset == 0 && size == entry.size)
    SD_CHECK(crc32_of(dst, size) == entry.crc32, "{}: entry '{}' is corrupt (CRC-32 mismatch)", path().string(),
             entry.name);
}

}  // namespace sd::io
