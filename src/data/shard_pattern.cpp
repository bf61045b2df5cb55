#include "data/shard_pattern.h"

#include <fmt/format.h>
#include <glob.h>

#include <algorithm>
#include <optional>
#include <regex>
#include <string_view>

#include "core/error.h"

namespace sd::data {

namespace fs = std::filesystem;

namespace {

constexpr size_t kMaxExpansions = 1'000'000;

// What each part of a pattern is expanded with; escapes stay in place until the whole pattern is expanded, as
// braceexpand does, so "\," and "\}" keep their meaning at every level.
std::vector<std::string> expand_pattern(std::string_view pattern, const std::string& whole);

// Index of the '}' closing the '{' at `open`, or npos.
size_t matching_brace(std::string_view s, size_t open) {
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == '\\') {
      ++i;
    } else if (s[i] == '{') {
      ++depth;
    } else if (s[i] == '}' && --depth == 0) {
      return i;
    }
  }
  return std::string_view::npos;
}

// The pieces of `s` between its top-level commas (none if it has no top-level comma).
std::vector<std::string_view> split_top_level_commas(std::string_view s) {
  std::vector<std::string_view> parts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\') {
      ++i;
    } else if (s[i] == '{') {
      ++depth;
    } else if (s[i] == '}') {
      --depth;
    } else if (s[i] == ',' && depth == 0) {
      parts.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  if (!parts.empty()) parts.push_back(s.substr(start));
  return parts;
}

int64_t parse_number(const std::string& text, const std::string& whole) {
  try {
    return std::stoll(text);
  } catch (const std::exception&) {
    fail("shard pattern '{}': number {} is out of range", whole, text);
  }
}

void check_count(uint64_t count, const std::string& whole) {
  SD_CHECK(count <= kMaxExpansions, "shard pattern '{}' expands to more than {} names", whole, kMaxExpansions);
}

// Inclusive range first..last by step, counting down when first > last.
std::vector<int64_t> inclusive_range(int64_t first, int64_t last, int64_t step, const std::string& whole) {
  const uint64_t span = first <= last ? static_cast<uint64_t>(last) - static_cast<uint64_t>(first)
                                      : static_cast<uint64_t>(first) - static_cast<uint64_t>(last);
  check_count(span / static_cast<uint64_t>(step) + 1, whole);
  std::vector<int64_t> values;
  for (uint64_t k = 0; k <= span / static_cast<uint64_t>(step); ++k) {
    const uint64_t offset = k * static_cast<uint64_t>(step);
    values.push_back(first <= last ? first + static_cast<int64_t>(offset) : first - static_cast<int64_t>(offset));
  }
  return values;
}

// {N..M} or {N..M..STEP}; nullopt if `body` is not one. The step's sign is ignored and 0 counts as 1.
std::optional<std::vector<std::string>> expand_number_range(const std::string& body, const std::string& whole) {
  static const std::regex kNumberRange(R"(^(-?[0-9]+)\.\.(-?[0-9]+)(?:\.\.-?([0-9]+))?$)");
  std::smatch m;
  if (!std::regex_match(body, m, kNumberRange)) return std::nullopt;
  const std::string left = m[1], right = m[2];
  const int64_t step = m[3].matched ? std::max<int64_t>(parse_number(m[3], whole), 1) : 1;
  // A bound written with a leading zero ("007", "-07", but not "0" itself) pads every number to the wider bound.
  auto has_leading_zero = [](const std::string& s) {
    return s != "0" && s != "-0" && (s.rfind("0", 0) == 0 || s.rfind("-0", 0) == 0);
  };
  const size_t width = has_leading_zero(left) || has_leading_zero(right) ? std::max(left.size(), right.size()) : 0;
  std::vector<std::string> out;
  for (int64_t n : inclusive_range(parse_number(left, whole), parse_number(right, whole), step, whole))
    out.push_back(fmt::format("{:0{}d}", n, width));
  return out;
}

// {a..e} or {a..e..STEP} over the letters A..Z then a..z; nullopt if `body` is not one.
std::optional<std::vector<std::string>> expand_letter_range(const std::string& body, const std::string& whole) {
  static const std::regex kLetterRange(R"(^([A-Za-z])\.\.([A-Za-z])(?:\.\.-?([0-9]+))?$)");
  static const std::string kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  std::smatch m;
  if (!std::regex_match(body, m, kLetterRange)) return std::nullopt;
  const int64_t step = m[3].matched ? std::max<int64_t>(parse_number(m[3], whole), 1) : 1;
  const auto first = static_cast<int64_t>(kAlphabet.find(m.str(1)[0]));
  const auto last = static_cast<int64_t>(kAlphabet.find(m.str(2)[0]));
  std::vector<std::string> out;
  for (int64_t i : inclusive_range(first, last, step, whole)) out.emplace_back(1, kAlphabet[i]);
  return out;
}

// The names one brace group's body stands for.
std::vector<std::string> expand_group(std::string_view body, const std::string& whole) {
  const std::string text(body);
  if (auto numbers = expand_number_range(text, whole)) return *numbers;
  if (auto letters = expand_letter_range(text, whole)) return *letters;
  const std::vector<std::string_view> alternatives = split_top_level_commas(body);
  std::vector<std::string> out;
  if (alternatives.empty()) {  // neither range nor list: the braces stay, their inside is still expanded
    for (const std::string& inner : expand_pattern(body, whole)) out.push_back("{" + inner + "}");
    return out;
  }
  for (std::string_view alternative : alternatives) {
    std::vector<std::string> names = expand_pattern(alternative, whole);
    out.insert(out.end(), names.begin(), names.end());
    check_count(out.size(), whole);
  }
  return out;
}

// Every name in `prefixes` followed by every one of `suffixes`.
std::vector<std::string> combine(const std::vector<std::string>& prefixes, const std::vector<std::string>& suffixes,
                                 const std::string& whole) {
  check_count(static_cast<uint64_t>(prefixes.size()) * suffixes.size(), whole);
  std::vector<std::string> out;
  out.reserve(prefixes.size() * suffixes.size());
  for (const std::string& prefix : prefixes)
    for (const std::string& suffix : suffixes) out.push_back(prefix + suffix);
  return out;
}

std::vector<std::string> expand_pattern(std::string_view pattern, const std::string& whole) {
  std::vector<std::string> names = {""};
  size_t literal_start = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\') {
      ++i;
      continue;
    }
    SD_CHECK(pattern[i] != '}', "shard pattern '{}' has unbalanced braces", whole);
    if (pattern[i] != '{') continue;
    const size_t close = matching_brace(pattern, i);
    SD_CHECK(close != std::string_view::npos, "shard pattern '{}' has unbalanced braces", whole);
    names = combine(names, {std::string(pattern.substr(literal_start, i - literal_start))}, whole);
    names = combine(names, expand_group(pattern.substr(i + 1, close - i - 1), whole), whole);
    literal_start = close + 1;
    i = close;
  }
  return combine(names, {std::string(pattern.substr(literal_start))}, whole);
}

std::string remove_escapes(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) ++i;
    out.push_back(s[i]);
  }
  return out;
}

bool has_glob_characters(const std::string& name) { return name.find_first_of("*?[") != std::string::npos; }

// Sorted byte-wise rather than by the locale, so every rank and machine lists shards in the same order.
std::vector<fs::path> glob_sorted(const std::string& pattern) {
  glob_t result{};
  const int status = ::glob(pattern.c_str(), GLOB_NOSORT, nullptr, &result);
  std::vector<std::string> names;
  if (status == 0) names.assign(result.gl_pathv, result.gl_pathv + result.gl_pathc);
  ::globfree(&result);
  std::sort(names.begin(), names.end());
  return std::vector<fs::path>(names.begin(), names.end());
}

}  // namespace

std::vector<std::string> expand_braces(const std::string& pattern) {
  std::vector<std::string> names = expand_pattern(pattern, pattern);
  for (std::string& name : names) name = remove_escapes(name);
  return names;
}

std::vector<fs::path> resolve_shards(const std::string& pattern) {
  std::vector<fs::path> shards;
  for (const std::string& name : expand_braces(pattern)) {
    if (has_glob_characters(name)) {
      std::vector<fs::path> matches = glob_sorted(name);
      shards.insert(shards.end(), matches.begin(), matches.end());
    } else {
      SD_CHECK(fs::exists(name), "{}: shard not found (from the pattern '{}')", name, pattern);
      shards.emplace_back(name);
    }
  }
  SD_CHECK(!shards.empty(), "shard pattern '{}' matches no file", pattern);
  return shards;
}

}  // namespace sd::data
