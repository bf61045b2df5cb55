#include "io/json_config.h"

#include "io/atomic_file.h"

#include <cmath>
#include <limits>

namespace sd::io {

using nlohmann::json;

namespace {

// Python's json module writes the non-standard tokens -Infinity, Infinity and NaN for float('inf') / nan.
// Outside string literals they are turned into strings so a strict JSON parser accepts the file.
std::string quote_python_specials(const std::string& text) {
  std::string out;
  out.reserve(text.size() + 16);
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      out += ch;
      if (ch == '\\' && i + 1 < text.size()) {
        out += text[++i];
      } else if (ch == '"') {
        in_string = false;
      }
      continue;
    }
    if (ch == '"') {
      in_string = true;
      out += ch;
      continue;
    }
    bool replaced = false;
    for (const char* token : {"-Infinity", "Infinity", "NaN"}) {
      const size_t len = std::char_traits<char>::length(token);
      if (text.compare(i, len, token) == 0) {
        out += '"';
        out += token;
        out += '"';
        i += len - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += ch;
  }
  return out;
}

}  // namespace

json parse_python_json(const std::string& text, const std::string& source) {
  try {
    return json::parse(quote_python_specials(text));
  } catch (const json::exception& e) {
    fail("{}: invalid JSON ({})", source, e.what());
  }
}

JsonConfig::JsonConfig(json root, std::string source) : root_(std::move(root)), source_(std::move(source)) {
  SD_CHECK(root_.is_object(), "{}: expected a JSON object", source_);
}

JsonConfig JsonConfig::load(const std::filesystem::path& path) {
  SD_CHECK(std::filesystem::exists(path), "{}: missing file", path.string());
  return JsonConfig(parse_python_json(read_text_file(path), path.string()), path.string());
}

void check_at_most(const std::string& source, const std::string& key, int64_t value, int64_t limit) {
  SD_CHECK(value <= limit, "{}: key '{}' = {} is more than {}, the most sdtrain accepts", source, key, value, limit);
}

void JsonConfig::fail_key(const std::string& key, const std::string& expected) const {
  fail("{}: key '{}' must be {}, got {}", source_, key, expected, root_.contains(key) ? root_[key].dump() : "nothing");
}

template <>
int64_t JsonConfig::convert<int64_t>(const std::string& key, const json& value) const {
  if (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    fail_key(key, "an integer that fits in 64 bits");
  if (value.is_number_integer()) return value.get<int64_t>();
  // 1.0 is accepted as an integer: Python writes floats for some integral keys. The range check comes first
  // because casting a double outside int64's range is undefined behaviour.
  if (value.is_number_float()) {
    const double number = value.get<double>();
    const bool fits = number >= -0x1p63 && number < 0x1p63;
    if (fits && number == std::trunc(number)) return static_cast<int64_t>(number);
  }
  fail_key(key, "an integer");
}

template <>
int JsonConfig::convert<int>(const std::string& key, const json& value) const {
  const int64_t number = convert<int64_t>(key, value);
  if (number < std::numeric_limits<int>::min() || number > std::numeric_limits<int>::max())
    fail_key(key, "an integer that fits in 32 bits");
  return static_cast<int>(number);
}

template <>
double JsonConfig::convert<double>(const std::string& key, const json& value) const {
  if (!value.is_number()) fail_key(key, "a number");
  return value.get<double>();
}

template <>
bool JsonConfig::convert<bool>(const std::string& key, const json& value) const {
  if (!value.is_boolean()) fail_key(key, "true or false");
  return value.get<bool>();
}

template <>
std::string JsonConfig::convert<std::string>(const std::string& key, const json& value) const {
  if (!value.is_string()) fail_key(key, "a string");
  return value.get<std::string>();
}

template <>
std::vector<int64_t> JsonConfig::convert<std::vector<int64_t>>(const std::string& key, const json& value) const {
  if (!value.is_array()) fail_key(key, "a list of integers");
  std::vector<int64_t> out;
  for (const auto& v : value) {
    if (!v.is_number_integer()) fail_key(key, "a list of integers");
    out.push_back(v.get<int64_t>());
  }
  return out;
}

template <>
std::vector<std::string> JsonConfig::convert<std::vector<std::string>>(const std::string& key,
                                                                       const json& value) const {
  if (!value.is_array()) fail_key(key, "a list of strings");
  std::vector<std::string> out;
  for (const auto& v : value) {
    if (!v.is_string()) fail_key(key, "a list of strings");
    out.push_back(v.get<std::string>());
  }
  return out;
}

}  // namespace sd::io
