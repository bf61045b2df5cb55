#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/atomic_file.h"

namespace sd::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The reference implementation refuses headers above 100 MB; so do we, before allocating anything.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

const std::vector<std::pair<std::string, at::ScalarType>>& dtype_table() {
  static const std::vector<std::pair<std::string, at::ScalarType>> table = {
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16}, {"I64", at::kLong},
      {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},  {"U8", at::kByte},       {"BOOL", at::kBool}};
  return table;
}

void read_exactly(int fd, void* dst, uint64_t size, uint64_t offset, const fs::path& path) {
  auto* out = static_cast<char*>(dst);
  while (size > 0) {
    ssize_t got = pread(fd, out, size, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    SD_CHECK(got > 0, "{}: read failed at byte {} ({})", path.string(), offset,
             got == 0 ? "unexpected end of file" : std::strerror(errno));
    out += got;
    size -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

uint64_t non_negative_int(const json& value, const fs::path& path, const std::string& what) {
  SD_CHECK(value.is_number_integer() && value.get<int64_t>() >= 0,
           "{}: corrupt safetensors header: {} must be a non-negative integer, got {}", path.string(), what,
           value.dump());
  return value.get<uint64_t>();
}

TensorEntry parse_entry(const std::string& name, const json& value, const fs::path& path) {
  const std::string where = fmt::format("tensor '{}'", name);
  SD_CHECK(value.is_object(), "{}: corrupt safetensors header: {} is not an object", path.string(), where);
  SD_CHECK(value.contains("dtype") && value["dtype"].is_string(),
           "{}: corrupt safetensors header: {} has no string 'dtype'", path.string(), where);
  SD_CHECK(value.contains("shape") && value["shape"].is_array(),
           "{}: corrupt safetensors header: {} has no 'shape' array", path.string(), where);
  SD_CHECK(value.contains("data_offsets") && value["data_offsets"].is_array() && value["data_offsets"].size() == 2,
           "{}: corrupt safetensors header: {} needs 'data_offsets' [begin, end]", path.string(), where);
  TensorEntry entry;
  try {
    entry.dtype = dtype_from_safetensors(value["dtype"].get<std::string>());
  } catch (const Error& e) {
    fail("{}: {}: {}", path.string(), where, e.what());
  }
  uint64_t elements = 1;
  for (const auto& dim : value["shape"]) {
    uint64_t d = non_negative_int(dim, path, where + " shape entry");
    entry.shape.push_back(static_cast<int64_t>(d));
    SD_CHECK(d == 0 || elements <= UINT64_MAX / d, "{}: corrupt safetensors header: {} shape overflows", path.string(),
             where);
    elements *= d;
  }
  entry.begin = non_negative_int(value["data_offsets"][0], path, where + " data_offsets[0]");
  entry.end = non_negative_int(value["data_offsets"][1], path, where + " data_offsets[1]");
  SD_CHECK(entry.begin <= entry.end, "{}: corrupt safetensors header: {} has data_offsets begin {} > end {}",
           path.string(), where, entry.begin, entry.end);
  const uint64_t expected = elements * c10::elementSize(entry.dtype);
  SD_CHECK(entry.end - entry.begin == expected,
           "{}: corrupt safetensors header: {} is {} {} ({} bytes) but data_offsets span {} bytes", path.string(),
           where, value["dtype"].get<std::string>(), value["shape"].dump(), expected, entry.end - entry.begin);
  return entry;
}

}  // namespace

at::ScalarType dtype_from_safetensors(const std::string& name) {
  for (const auto& [n, t] : dtype_table())
    if (n == name) return t;
  fail("unsupported safetensors dtype '{}' (expected F64, F32, F16, BF16, I64, I32, I16, I8, U8 or BOOL)", name);
}

std::string dtype_to_safetensors(at::ScalarType dtype) {
  for (const auto& [n, t] : dtype_table())
    if (t == dtype) return n;
  fail("dtype {} cannot be stored in safetensors", c10::toString(dtype));
}

SafeTensorsFile::SafeTensorsFile(fs::path path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  SD_CHECK(fd_ >= 0, "{}: cannot open safetensors file ({})", path_.string(), std::strerror(errno));
  try {
    struct stat st {};
    SD_CHECK(fstat(fd_, &st) == 0, "{}: cannot stat ({})", path_.string(), std::strerror(errno));
    const auto file_size = static_cast<uint64_t>(st.st_size);
    SD_CHECK(file_size >= 8, "{}: truncated safetensors file: {} bytes, too short for the 8-byte header length",
             path_.string(), file_size);
    uint64_t header_len = 0;
    read_exactly(fd_, &header_len, 8, 0, path_);
    SD_CHECK(header_len <= kMaxHeaderBytes, "{}: corrupt safetensors file: header length {} exceeds {} bytes",
             path_.string(), header_len, kMaxHeaderBytes);
    SD_CHECK(8 + header_len <= file_size, "{}: truncated safetensors file: header needs {} bytes but the file has {}",
             path_.string(), 8 + header_len, file_size);
    std::string header(header_len, '\0');
    read_exactly(fd_, header.data(), header_len, 8, path_);
    json root;
    try {
      root = json::parse(header);
    } catch (const json::exception& e) {
      fail("{}: corrupt safetensors header: not valid UTF-8 JSON ({})", path_.string(), e.what());
    }
    SD_CHECK(root.is_object(), "{}: corrupt safetensors header: expected a JSON object", path_.string());
    data_start_ = 8 + header_len;

    std::vector<std::pair<uint64_t, std::string>> by_offset;
    for (const auto& [name, value] : root.items()) {
      if (name == "__metadata__") {
        SD_CHECK(value.is_object(), "{}: corrupt safetensors header: __metadata__ must be an object", path_.string());
        for (const auto& [k, v] : value.items()) {
          SD_CHECK(v.is_string(), "{}: corrupt safetensors header: __metadata__['{}'] must be a string", path_.string(),
                   k);
          metadata_[k] = v.get<std::string>();
        }
        continue;
      }
      entries_[name] = parse_entry(name, value, path_);
      by_offset.emplace_back(entries_[name].begin, name);
    }
    // Tensors must tile the data section exactly: sorted by offset, each starting where the last ended.
    std::sort(by_offset.begin(), by_offset.end(), [&](const auto& a, const auto& b) {
      const auto& ea = entries_[a.second];
      const auto& eb = entries_[b.second];
      return std::tie(ea.begin, ea.end) < std::tie(eb.begin, eb.end);
    });
    uint64_t cursor = 0;
    for (const auto& [begin, name] : by_offset) {
      const auto& e = entries_[name];
      SD_CHECK(e.begin == cursor,
               "{}: corrupt safetensors header: tensor '{}' starts at byte {} but the previous tensor ends at {} "
               "(tensors must be contiguous and non-overlapping)",
               path_.string(), name, e.begin, cursor);
      cursor = e.end;
      names_.push_back(name);
    }
    const uint64_t data_size = file_size - data_start_;
    SD_CHECK(cursor <= data_size, "{}: truncated safetensors file: header describes {} data bytes, file holds {}",
             path_.string(), cursor, data_size);
    SD_CHECK(cursor == data_size, "{}: corrupt safetensors file: {} trailing bytes after the last tensor",
             path_.string(), data_size - cursor);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafeTensorsFile::~SafeTensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

const TensorEntry& SafeTensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  SD_CHECK(it != entries_.end(), "{}: no tensor named '{}'", path_.string(), name);
  return it->second;
}

at::Tensor SafeTensorsFile::read(const std::string& name) const {
  const TensorEntry& e = entry(name);
  at::Tensor tensor = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
  read_exactly(fd_, tensor.data_ptr(), e.end - e.begin, data_start_ + e.begin, path_);
  return tensor;
}

TensorMap load_safetensors(const fs::path& path) {
  SafeTensorsFile file(path);
  TensorMap out;
  for (const auto& name : file.names()) out[name] = file.read(name);
  return out;
}

void save_safetensors(const fs::path& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, at::Tensor>> ordered;
  for (const auto& [name, t] : tensors) {
    SD_CHECK(name != "__metadata__", "{}: '__metadata__' cannot be a tensor name", path.string());
    ordered.emplace_back(name, t.detach().to(at::kCPU).contiguous());
  }
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const auto& a, const auto& b) { return a.second.element_size() > b.second.element_size(); });
  // nlohmann::ordered_json keeps insertion order, so __metadata__ comes first and tensors in data order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : ordered) {
    const uint64_t bytes = t.numel() * t.element_size();
    header[name] = {{"dtype", dtype_to_safetensors(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  write_atomically(path, [&](const fs::path& tmp) {
    std::ofstream out(tmp, std::ios::binary);
    const uint64_t header_len = text.size();
    out.write(reinterpret_cast<const char*>(&header_len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& [name, t] : ordered)
      out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * t.element_size()));
    out.close();
    SD_CHECK(out.good(), "{}: could not write safetensors file", tmp.string());
  });
}

}  // namespace sd::io
