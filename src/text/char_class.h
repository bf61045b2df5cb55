// Sets of characters and fixed-length runs of them: just enough regular expression to reproduce ftfy's patterns
// (each of which is an alternation of runs of character classes) without a regex engine whose \s, \w and
// backtracking would differ from Python's.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace sd::text {

class CharClass {
 public:
  // Written as inside a regex's brackets: single characters and X-Y ranges ("a-zA-Z\u00C0-\u00D1").
  explicit CharClass(std::u32string_view spec);
  // The same for byte patterns, each byte standing for the code point of its value ("\xc2\xc3\xe0-\xe3").
  static CharClass bytes(std::string_view spec);
  // Every character for which `predicate` holds (\s, \w).
  static CharClass matching(bool (*predicate)(char32_t));
  // Every character not in `spec`: [^A-Za-z], or "." as [^\n].
  static CharClass all_except(std::u32string_view spec);

  // The union of both sets.
  CharClass operator+(const CharClass& other) const;
  bool contains(char32_t c) const;

 private:
  CharClass() = default;

  std::vector<std::pair<char32_t, char32_t>> ranges_;  // sorted, merged, inclusive
  std::vector<bool (*)(char32_t)> predicates_;
};

// A run of classes, one per character: what a regex like "[ab][cd]" matches.
using CharRun = std::vector<CharClass>;

// Whether `run` matches text[pos...]. `Text` is a u32 string (code points) or a byte string.
template <typename Text>
bool matches_at(const CharRun& run, const Text& text, size_t pos) {
  using Unit = std::make_unsigned_t<typename Text::value_type>;
  if (pos + run.size() > text.size()) return false;
  for (size_t i = 0; i < run.size(); ++i)
    if (!run[i].contains(static_cast<char32_t>(static_cast<Unit>(text[pos + i])))) return false;
  return true;
}

// The first of `runs` (in order, as a regex alternation tries them) that matches at `pos`, or nullptr.
template <typename Text>
const CharRun* first_match_at(const std::vector<CharRun>& runs, const Text& text, size_t pos) {
  for (const CharRun& run : runs)
    if (matches_at(run, text, pos)) return &run;
  return nullptr;
}

}  // namespace sd::text
