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

// A zip archive of stored (uncompressed) entries with correct CRC-32s and central directory.
inline std::string zip_of(const std::vector<std::pair<std::string, std::string>>& entries) {
  std::string out, directory;
  for (const auto& [name, data] : entries) {
    const uint32_t crc =
        crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size()));
    const uint64_t offset = out.size();
    std::string fields;    // shared by the local and central headers: flags .. extra length
    put_le(fields, 0, 2);  // flags
    put_le(fields, 0, 2);  // method: stored
    put_le(fields, 0, 4);  // time, date
    put_le(fields, crc, 4);
    put_le(fields, data.size(), 4);
    put_le(fields, data.size(), 4);
    put_le(fields, name.size(), 2);
    put_le(fields, 0, 2);  // extra length
    put_le(out, 0x04034b50, 4);
    put_le(out, 20, 2);  // version needed
    out += fields + name + data;
    put_le(directory, 0x02014b50, 4);
    put_le(directory, 20, 2);  // version made by
    put_le(directory, 20, 2);  // version needed
    directory += fields;
    put_le(directory, 0, 2);  // comment length
    put_le(directory, 0, 2);  // disk
    put_le(directory, 0, 2);  // internal attributes
    put_le(directory, 0, 4);  // external attributes
    put_le(directory, offset, 4);
    directory += name;
  }
  const uint64_t directory_offset = out.size();
  out += directory;
  put_le(out, 0x06054b50, 4);
  put_le(out, 0, 4);  // disks
  put_le(out, entries.size(), 2);
  put_le(out, entries.size(), 2);
  put_le(out, directory.size(), 4);
  put_le(out, directory_offset, 4);
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
inline std::string torch_archive(const std::string& pickle, const std::string& storage) {
  return zip_of({{"archive/data.pkl", pickle}, {"archive/data/0", storage}, {"archive/version", "3\n"}});
}

}  // namespace sd::test
