// Typed access to diffusers/transformers JSON configs. A missing (or null) key takes the caller's default,
// as diffusers does; a present key of the wrong type is an error naming the file and the key.
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"

namespace sd::io {

// Parses JSON as Python's json module writes it (what diffusers' and transformers' save_pretrained produce): the
// non-standard -Infinity / Infinity / NaN tokens become the strings "-Infinity" / "Infinity" / "NaN", which the
// readers of such keys take back as numbers. Invalid JSON throws sd::Error naming `source`.
nlohmann::json parse_python_json(const std::string& text, const std::string& source);

// A config value that sizes an allocation or a loop, held to `limit` before anything is built from it, so that a
// damaged or hostile file is refused with a line instead of allocating terabytes or looping for hours:
// "<source>: key '<key>' = <value> is more than <limit>, the most sdtrain accepts".
void check_at_most(const std::string& source, const std::string& key, int64_t value, int64_t limit);

class JsonConfig {
 public:
  JsonConfig() = default;
  JsonConfig(nlohmann::json root, std::string source);
  // Reads and parses a JSON object file (parse_python_json); a missing file or invalid JSON throws sd::Error naming it.
  static JsonConfig load(const std::filesystem::path& path);

  const std::string& source() const { return source_; }
  const nlohmann::json& raw() const { return root_; }
  bool has(const std::string& key) const { return root_.contains(key) && !root_[key].is_null(); }

  template <typename T>
  T get(const std::string& key, T fallback) const {
    if (!has(key)) return fallback;
    return convert<T>(key, root_[key]);
  }
  template <typename T>
  std::optional<T> get_optional(const std::string& key) const {
    if (!has(key)) return std::nullopt;
    return convert<T>(key, root_[key]);
  }
  template <typename T>
  T require(const std::string& key) const {
    SD_CHECK(has(key), "{}: missing required key '{}'", source_, key);
    return convert<T>(key, root_[key]);
  }
  [[noreturn]] void fail_key(const std::string& key, const std::string& expected) const;

 private:
  template <typename T>
  T convert(const std::string& key, const nlohmann::json& value) const;

  nlohmann::json root_ = nlohmann::json::object();
  std::string source_;
};

template <>
int64_t JsonConfig::convert<int64_t>(const std::string& key, const nlohmann::json& value) const;
template <>
int JsonConfig::convert<int>(const std::string& key, const nlohmann::json& value) const;
template <>
double JsonConfig::convert<double>(const std::string& key, const nlohmann::json& value) const;
template <>
bool JsonConfig::convert<bool>(const std::string& key, const nlohmann::json& value) const;
template <>
std::string JsonConfig::convert<std::string>(const std::string& key, const nlohmann::json& value) const;
template <>
std::vector<int64_t> JsonConfig::convert<std::vector<int64_t>>(const std::string& key,
                                                               const nlohmann::json& value) const;
template <>
std::vector<std::string> JsonConfig::convert<std::vector<std::string>>(const std::string& key,
                                                                       const nlohmann::json& value) const;

}  // namespace sd::io
