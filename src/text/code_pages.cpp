#include "text/code_pages.h"

#include <numeric>

namespace sd::text {

namespace {

#include "text/code_pages.inc"

constexpr uint8_t kSubstituteByte = 0x1A;
constexpr char32_t kReplacementChar = 0xFFFD;

std::array<char32_t, 128> latin1_high_half() {
  std::array<char32_t, 128> table{};
  std::iota(table.begin(), table.end(), char32_t{0x80});
  return table;
}

bool is_continuation(uint8_t b) { return b >= 0x80 && b <= 0xBF; }

// CESU-8's encoding of one character beyond U+FFFF: ED A0..AF xx (high surrogate) ED B0..BF xx (low surrogate).
std::optional<char32_t> cesu8_pair_at(std::string_view bytes, size_t i) {
  if (i + 6 > bytes.size()) return std::nullopt;
  auto at = [&](size_t k) { return static_cast<uint8_t>(bytes[i + k]); };
  const bool pair = at(0) == 0xED && at(1) >= 0xA0 && at(1) <= 0xAF && is_continuation(at(2)) && at(3) == 0xED &&
                    at(4) >= 0xB0 && at(4) <= 0xBF && is_continuation(at(5));
  if (!pair) return std::nullopt;
  const char32_t high = ((at(1) & 0x0F) << 6) | (at(2) & 0x3F);  // the surrogate's low 10 bits
  const char32_t low = ((at(4) & 0x0F) << 6) | (at(5) & 0x3F);
  return 0x10000 + (high << 10) + low;
}

// One standard UTF-8 sequence at bytes[i]: its code point and length, or nullopt where Python's strict decoder
// fails (bad lead byte, overlong form, surrogate, beyond U+10FFFF, truncated).
std::optional<std::pair<char32_t, size_t>> utf8_sequence_at(std::string_view bytes, size_t i) {
  const auto lead = static_cast<uint8_t>(bytes[i]);
  size_t length = 0;
  uint8_t second_min = 0x80, second_max = 0xBF;
  char32_t code_point = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2, code_point = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3, code_point = lead & 0x0F;
    if (lead == 0xE0) second_min = 0xA0;
    if (lead == 0xED) second_max = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4, code_point = lead & 0x07;
    if (lead == 0xF0) second_min = 0x90;
    if (lead == 0xF4) second_max = 0x8F;
  } else {
    return std::nullopt;
  }
  if (i + length > bytes.size()) return std::nullopt;
  for (size_t k = 1; k < length; ++k) {
    const auto b = static_cast<uint8_t>(bytes[i + k]);
    const bool in_range = k == 1 ? b >= second_min && b <= second_max : is_continuation(b);
    if (!in_range) return std::nullopt;
    code_point = (code_point << 6) | (b & 0x3F);
  }
  return std::make_pair(code_point, length);
}

}  // namespace

CodePage::CodePage(std::string name, const std::array<char32_t, 128>& high_half, bool sloppy)
    : name_(std::move(name)), high_half_(high_half), sloppy_(sloppy) {
  for (size_t i = 0; i < high_half_.size(); ++i) byte_of_[high_half_[i]] = static_cast<uint8_t>(0x80 + i);
  if (sloppy_) byte_of_[kReplacementChar] = kSubstituteByte;
}

char32_t CodePage::decode(uint8_t byte) const {
  if (byte >= 0x80) return high_half_[byte - 0x80];
  return sloppy_ && byte == kSubstituteByte ? kReplacementChar : byte;
}

std::optional<std::string> CodePage::encode(std::u32string_view text) const {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text) {
    if (c < 0x80 && !(sloppy_ && c == kSubstituteByte)) {
      out.push_back(static_cast<char>(c));
      continue;
    }
    auto it = byte_of_.find(c);
    if (it == byte_of_.end()) return std::nullopt;
    out.push_back(static_cast<char>(it->second));
  }
  return out;
}

const std::vector<CodePage>& mojibake_code_pages() {
  static const std::vector<CodePage> pages = {
      {"latin-1", latin1_high_half(), false},
      {"sloppy-windows-1252", kWindows1252, true},
      {"sloppy-windows-1251", kWindows1251, true},
      {"sloppy-windows-1250", kWindows1250, true},
      {"sloppy-windows-1253", kWindows1253, true},
      {"sloppy-windows-1254", kWindows1254, true},
      {"iso-8859-2", kIso8859_2, false},
      {"macroman", kMacRoman, false},
      {"cp437", kCp437, false},
  };
  return pages;
}

const CodePage& sloppy_windows_1252() { return mojibake_code_pages()[1]; }

std::optional<std::u32string> decode_utf8_variants(std::string_view bytes) {
  std::u32string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const auto b = static_cast<uint8_t>(bytes[i]);
    if (b < 0x80) {
      out.push_back(b);
      ++i;
    } else if (b == 0xC0) {  // only Java's two-byte null; any other C0 sequence is overlong
      if (i + 1 >= bytes.size() || static_cast<uint8_t>(bytes[i + 1]) != 0x80) return std::nullopt;
      out.push_back(0);
      i += 2;
    } else if (auto astral = cesu8_pair_at(bytes, i)) {
      out.push_back(*astral);
      i += 6;
    } else if (auto sequence = utf8_sequence_at(bytes, i)) {
      out.push_back(sequence->first);
      i += sequence->second;
    } else {
      return std::nullopt;
    }
  }
  return out;
}

}  // namespace sd::text
