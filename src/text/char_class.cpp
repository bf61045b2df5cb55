#include "text/char_class.h"

#include <algorithm>

namespace sd::text {

namespace {

constexpr char32_t kMaxCodePoint = 0x10FFFF;

// Sorts ranges and joins those that overlap or touch, so membership is one binary search.
std::vector<std::pair<char32_t, char32_t>> merged(std::vector<std::pair<char32_t, char32_t>> ranges) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<char32_t, char32_t>> out;
  for (const auto& r : ranges) {
    if (!out.empty() && r.first <= out.back().second + 1)
      out.back().second = std::max(out.back().second, r.second);
    else
      out.push_back(r);
  }
  return out;
}

// "a-z" is a range only with a character on each side of the '-' (as in a regex class).
std::vector<std::pair<char32_t, char32_t>> parse_ranges(std::u32string_view spec) {
  std::vector<std::pair<char32_t, char32_t>> ranges;
  for (size_t i = 0; i < spec.size(); ++i) {
    if (i + 2 < spec.size() && spec[i + 1] == U'-') {
      ranges.emplace_back(spec[i], spec[i + 2]);
      i += 2;
    } else {
      ranges.emplace_back(spec[i], spec[i]);
    }
  }
  return merged(std::move(ranges));
}

}  // namespace

CharClass::CharClass(std::u32string_view spec) : ranges_(parse_ranges(spec)) {}

CharClass CharClass::bytes(std::string_view spec) {
  std::u32string code_points;
  for (char b : spec) code_points.push_back(static_cast<unsigned char>(b));
  return CharClass(code_points);
}

CharClass CharClass::matching(bool (*predicate)(char32_t)) {
  CharClass c;
  c.predicates_.push_back(predicate);
  return c;
}

CharClass CharClass::all_except(std::u32string_view spec) {
  CharClass c;
  char32_t next = 0;  // the first code point not yet covered
  for (const auto& [first, last] : parse_ranges(spec)) {
    if (first > next) c.ranges_.emplace_back(next, first - 1);
    next = last + 1;
  }
  if (next <= kMaxCodePoint) c.ranges_.emplace_back(next, kMaxCodePoint);
  return c;
}

CharClass CharClass::operator+(const CharClass& other) const {
  CharClass out;
  out.ranges_ = ranges_;
  out.ranges_.insert(out.ranges_.end(), other.ranges_.begin(), other.ranges_.end());
  out.ranges_ = merged(std::move(out.ranges_));
  out.predicates_ = predicates_;
  out.predicates_.insert(out.predicates_.end(), other.predicates_.begin(), other.predicates_.end());
  return out;
}

bool CharClass::contains(char32_t c) const {
  auto after = std::upper_bound(ranges_.begin(), ranges_.end(), c,
                                [](char32_t value, const auto& range) { return value < range.first; });
  if (after != ranges_.begin() && c <= std::prev(after)->second) return true;
  return std::any_of(predicates_.begin(), predicates_.end(), [c](auto predicate) { return predicate(c); });
}

}  // namespace sd::text
