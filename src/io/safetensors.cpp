#include "io/safetensors.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

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
  const uint64_t element_size = c10::elementSize(entry.dtype);
  SD_CHECK(elements <= UINT64_MAX / element_size, "{}: corrupt safetensors header: {} shape overflows", path.string(),
           where);
  const uint64_t expected = elements * element_size;
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

SafeTensorsFile::SafeTensorsFile(fs::path path) : file_(std::move(path)) {
  const std::string name = file_.path().string();
  const uint64_t file_size = file_.size();
  SD_CHECK(file_size >= 8, "{}: truncated safetensors file: {} bytes, too short for the 8-byte header length", name,
           file_size);
  uint64_t header_len = 0;
  file_.read(&header_len, 8, 0);
  SD_CHECK(header_len <= kMaxHeaderBytes, "{}: corrupt safetensors file: header length {} exceeds {} bytes", name,
           header_len, kMaxHeaderBytes);
  SD_CHECK(8 + header_len <= file_size, "{}: truncated safetensors file: header needs {} bytes but the file has {}",
           name, 8 + header_len, file_size);
  const std::string header = file_.read(header_len, 8);
  json root;
  // JSON keeps the last of two equal keys; safetensors' own reader refuses them, and so does this one.
  std::set<std::string> keys;
  std::string duplicate;
  const auto note_duplicate_keys = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key && !keys.insert(parsed.get<std::string>()).second)
      duplicate = parsed.get<std::string>();
    return true;
  };
  try {
    root = json::parse(header, note_duplicate_keys);
  } catch (const json::exception& e) {
    fail("{}: corrupt safetensors header: not valid UTF-8 JSON ({})", name, e.what());
  }
  SD_CHECK(duplicate.empty(), "{}: corrupt safetensors header: tensor '{}' is listed twice", name, duplicate);
  SD_CHECK(root.is_object(), "{}: corrupt safetensors header: expected a JSON object", name);
  data_start_ = 8 + header_len;

  std::vector<std::pair<uint64_t, std::string>> by_offset;
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      SD_CHECK(value.is_object(), "{}: corrupt safetensors header: __metadata__ must be an object", name);
      for (const auto& [k, v] : value.items()) {
        SD_CHECK(v.is_string(), "{}: corrupt safetensors header: __metadata__['{}'] must be a string", name, k);
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    entries_[key] = parse_entry(key, value, file_.path());
    by_offset.emplace_back(entries_[key].begin, key);
  }
  // Tensors must tile the data section exactly: sorted by offset, each starting where the last ended.
  std::sort(by_offset.begin(), by_offset.end(), [&](const auto& a, const auto& b) {
    const auto& ea = entries_[a.second];
    const auto& eb = entries_[b.second];
    return std::tie(ea.begin, ea.end) < std::tie(eb.begin, eb.end);
  });
  uint64_t cursor = 0;
  for (const auto& [begin, key] : by_offset) {
    const auto& e = entries_[key];
    SD_CHECK(e.begin == cursor,
             "{}: corrupt safetensors header: tensor '{}' starts at byte {} but the previous tensor ends at {} "
             "(tensors must be contiguous and non-overlapping)",
             name, key, e.begin, cursor);
    cursor = e.end;
    names_.push_back(key);
  }
  const uint64_t data_size = file_size - data_start_;
  SD_CHECK(cursor <= data_size, "{}: truncated safetensors file: header describes {} data bytes, file holds {}", name,
           cursor, data_size);
  SD_CHECK(cursor == data_size, "{}: corrupt safetensors file: {} trailing bytes after the last tensor", name,
           data_size - cursor);
}

const TensorEntry& SafeTensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  SD_CHECK(it != entries_.end(), "{}: no tensor named '{}'", label(), name);
  return it->second;
}

TensorInfo SafeTensorsFile::info(const std::string& name) const {
  const TensorEntry& e = entry(name);
  return {e.dtype, e.shape};
}

at::Tensor SafeTensorsFile::read(const std::string& name) const {
  const TensorEntry& e = entry(name);
  const uint64_t offset = data_start_ + e.begin, size = e.end - e.begin;
  if (size >= kMappedBytes && offset % c10::elementSize(e.dtype) == 0)
    if (std::shared_ptr<std::byte> pages = file_.map(size, offset))
      return at::from_blob(
          pages.get(), e.shape, [pages](void*) {}, at::TensorOptions().dtype(e.dtype));
  at::Tensor tensor = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
  file_.read(tensor.data_ptr(), size, offset);
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
  write_file_atomically(path, [&](FileWriter& out) {
    const uint64_t header_len = text.size();
    out.write(&header_len, 8);
    out.write(text);
    for (const auto& [name, t] : ordered) out.write(t.data_ptr(), t.numel() * t.element_size());
  });
}

}  // namespace sd::io
