// Hand-built torch.save archives for the reader's tests: a zip of stored entries (what torch.save writes) and the
// pickle opcodes of a one-tensor state dict, so each test can forge exactly the part it wants to break.
#pragma once
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace sd::test {

inline void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((value >> (8 * i)) & 0xFF);
}

constexpr uint64_t kZip64Marker = 0xFFFFFFFF;  // a 32-bit field whose value is in the ZIP64 extra field

// A ZIP64 extra field (id 1) holding `values` as 64-bit numbers.
inline std::string zip64_extra(const std::vector<uint64_t>& values) {
  std::string out;
  put_le(out, 1, 2);
  put_le(out, 8 * values.size(), 2);
  for (uint64_t v : values) put_le(out, v, 8);
  return out;
}

// A zip archive of stored (uncompressed) entries with correct CRC-32s and central directory. With `zip64`, sizes and
// offsets are written as torch.save writes them past 4 GiB: 0xFFFFFFFF in the 32-bit fields, the values in ZIP64
// extra fields, and a ZIP64 end record and locator before the end record.
inline std::string zip_of(const std::vector<std::pair<std::string, std::string>>& entries, bool zip64 = false) {
  std::string out, directory;
  for (const auto& [name, data] : entries) {
    const uint32_t crc =
        crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size()));
    const uint64_t offset = out.size();
    const uint64_t size = zip64 ? kZip64Marker : data.size();
    const std::string local_extra = zip64 ? zip64_extra({data.size(), data.size()}) : "";
    const std::string central_extra = zip64 ? zip64_extra({data.size(), data.size(), offset}) : "";
    std::string fields;    // shared by the local and central headers: flags .. name length
    put_le(fields, 0, 2);  // flags
    put_le(fields, 0, 2);  // method: stored
    put_le(fields, 0, 4);  // time, date
    put_le(fields, crc, 4);
    put_le(fields, size, 4);
    put_le(fields, size, 4);
    put_le(fields, name.size(), 2);
    put_le(out, 0x04034b50, 4);
    put_le(out, 20, 2);  // version needed
    out += fields;
    put_le(out, local_extra.size(), 2);
    out += name + local_extra + data;
    put_le(directory, 0x02014b50, 4);
    put_le(directory, 20, 2);  // version made by
    put_le(directory, 20, 2);  // version needed
    directory += fields;
    put_le(directory, central_extra.size(), 2);
    put_le(directory, 0, 2);  // comment length
    put_le(directory, 0, 2);  // disk
    put_le(directory, 0, 2);  // internal attributes
    put_le(directory, 0, 4);  // external attributes
    put_le(directory, zip64 ? kZip64Marker : offset, 4);
    directory += name + central_extra;
  }
  const uint64_t directory_offset = out.size();
  out += directory;
  if (zip64) {
    const uint64_t record_offset = out.size();
    put_le(out, 0x06064b50, 4);
    put_le(out, 44, 8);  // size of the rest of the record
    put_le(out, 45, 2);  // version made by
    put_le(out, 45, 2);  // version needed
    put_le(out, 0, 8);   // disks
    put_le(out, entries.size(), 8);
    put_le(out, entries.size(), 8);
    put_le(out, directory.size(), 8);
    put_le(out, directory_offset, 8);
    put_le(out, 0x07064b50, 4);  // the locator
    put_le(out, 0, 4);
    put_le(out, record_offset, 8);
    put_le(out, 1, 4);  // total disks
  }
  put_le(out, 0x06054b50, 4);
  put_le(out, 0, 4);  // disks
  put_le(out, zip64 ? 0xFFFF : entries.size(), 2);
  put_le(out, zip64 ? 0xFFFF : entries.size(), 2);
  put_le(out, zip64 ? kZip64Marker : directory.size(), 4);
  put_le(out, zip64 ? kZip64Marker : directory_offset, 4);
  put_le(out, 0, 2);  // comment length
  return out;
}

inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Pickle opcodes (protocol 2) for pieces of a state dict.
inline std::string pickle_unicode(const std::string& text) {
  std::string out = "X";
  put_le(out, text.size(), 4);
  return out + text;
}

inline std::string pickle_int(int64_t value) {
  std::string out = "J";
  put_le(out, static_cast<uint64_t>(value), 4);
  return out;
}

inline std::string pickle_int_tuple(const std::vector<int64_t>& values) {
  std::string out = "(";
  for (int64_t v : values) out += pickle_int(v);
  return out + "t";
}

// {name: _rebuild_tensor_v2(storage '0' of `numel` float32, offset, size, stride, False, OrderedDict())}
inline std::string one_tensor_pickle(const std::string& name, int64_t numel, int64_t offset,
                                     const std::vector<int64_t>& size, const std::vector<int64_t>& stride) {
  return "\x80\x02}(" + pickle_unicode(name) + "ctorch._utils\n_rebuild_tensor_v2\n((" + pickle_unicode("storage") +
         "ctorch\nFloatStorage\n" + pickle_unicode("0") + pickle_unicode("cpu") + pickle_int(numel) + "tQ" +
         pickle_int(offset) + pickle_int_tuple(size) + pickle_int_tuple(stride) +
         "\x89"
         "ccollections\nOrderedDict\n)RtRu.";
}

// A torch.save archive: archive/data.pkl, archive/data/0 holding `storage`, archive/version.
inline std::string torch_archive(const std::string& pickle, const std::string& storage, bool zip64 = false) {
  return zip_of({{"archive/data.pkl", pickle}, {"archive/data/0", storage}, {"archive/version", "3\n"}}, zip64);
}

}  // namespace sd::test
