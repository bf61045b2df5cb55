#include "text/text_fixer.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <cstring>

#include "text/code_pages.h"
#include "text/mojibake.h"
#include "text/unicode.h"

namespace sd::text {

namespace {

// ftfy's max_decode_length: the longest piece of text fixed at once, bounding the work on text without newlines.
constexpr size_t kMaxSegmentLength = 1'000'000;

struct Entity {
  const char* name;         // "&amp;"
  const char* replacement;  // UTF-8
};

constexpr Entity kEntities[] = {
#include "text/html_entities.inc"
};

const Entity* find_entity(const std::string& name) {
  auto it =
      std::lower_bound(std::begin(kEntities), std::end(kEntities), name,
                       [](const Entity& e, const std::string& key) { return std::strcmp(e.name, key.c_str()) < 0; });
  if (it != std::end(kEntities) && name == it->name) return it;
  return nullptr;
}

bool is_ascii_alnum(char32_t c) {
  return (c >= U'0' && c <= U'9') || (c >= U'a' && c <= U'z') || (c >= U'A' && c <= U'Z');
}
bool is_ascii_digit(char32_t c) { return c >= U'0' && c <= U'9'; }
bool is_ascii_hex(char32_t c) { return is_ascii_digit(c) || (c >= U'a' && c <= U'f') || (c >= U'A' && c <= U'F'); }
int hex_value(char32_t c) {
  if (is_ascii_digit(c)) return static_cast<int>(c - U'0');
  if (c >= U'a' && c <= U'f') return static_cast<int>(c - U'a' + 10);
  return static_cast<int>(c - U'A' + 10);
}

// What Python's html.unescape makes of a numeric character reference (its _replace_charref).
std::u32string charref(uint64_t num) {
  if (num == 0x00) return U"\uFFFD";
  if (num == 0x0D) return U"\r";
  // Windows-1252 for 0x80..0x9F, the five numbers it leaves unassigned staying C1 controls (html.unescape).
  if (num >= 0x80 && num <= 0x9F) return std::u32string(1, sloppy_windows_1252().decode(static_cast<uint8_t>(num)));
  if ((num >= 0xD800 && num <= 0xDFFF) || num > 0x10FFFF) return U"\uFFFD";
  const bool invalid = (num >= 0x1 && num <= 0x8) || (num >= 0xE && num <= 0x1F) || (num >= 0x7F && num <= 0x9F) ||
                       (num >= 0xFDD0 && num <= 0xFDEF) || num == 0xB || (num & 0xFFFE) == 0xFFFE;
  if (invalid) return U"";
  return std::u32string(1, static_cast<char32_t>(num));
}

// One match of ftfy's HTML_ENTITY_RE (&#?[0-9A-Za-z]{1,24};) -> its replacement, or the match itself.
std::u32string unescape_one(std::u32string_view match, bool numeric, std::u32string_view body) {
  if (!numeric) {
    std::string key;
    for (char32_t c : match) key.push_back(static_cast<char>(c));
    if (const Entity* e = find_entity(key)) return utf8_to_u32(e->replacement);
    return std::u32string(match);
  }
  // ftfy hands "&#...;" to html.unescape and keeps the result only if the ';' was consumed, i.e. the whole
  // body is one decimal or one 'x'+hex number.
  uint64_t num = 0;
  size_t i = 0;
  if ((body[0] == U'x' || body[0] == U'X') && body.size() > 1 && is_ascii_hex(body[1])) {
    for (i = 1; i < body.size() && is_ascii_hex(body[i]); ++i)
      num = std::min<uint64_t>(num * 16 + hex_value(body[i]), 0x7FFFFFFF);
  } else if (is_ascii_digit(body[0])) {
    for (i = 0; i < body.size() && is_ascii_digit(body[i]); ++i)
      num = std::min<uint64_t>(num * 10 + (body[i] - U'0'), 0x7FFFFFFF);
  } else {
    return std::u32string(match);
  }
  if (i != body.size()) return std::u32string(match);
  return charref(num);
}

std::u32string fix_latin_ligatures(std::u32string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (char32_t c : text) {
    switch (c) {
      case 0x0132: out += U"IJ"; break;
      case 0x0133: out += U"ij"; break;
      case 0x0149: out += U"\u02BCn"; break;
      case 0x01F1: out += U"DZ"; break;
      case 0x01F2: out += U"Dz"; break;
      case 0x01F3: out += U"dz"; break;
      case 0x01C4: out += U"D\u017D"; break;
      case 0x01C5: out += U"D\u017E"; break;
      case 0x01C6: out += U"d\u017E"; break;
      case 0x01C7: out += U"LJ"; break;
      case 0x01C8: out += U"Lj"; break;
      case 0x01C9: out += U"lj"; break;
      case 0x01CA: out += U"NJ"; break;
      case 0x01CB: out += U"Nj"; break;
      case 0x01CC: out += U"nj"; break;
      case 0xFB00: out += U"ff"; break;
      case 0xFB01: out += U"fi"; break;
      case 0xFB02: out += U"fl"; break;
      case 0xFB03: out += U"ffi"; break;
      case 0xFB04: out += U"ffl"; break;
      case 0xFB05: out += U"\u017Ft"; break;
      case 0xFB06: out += U"st"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

// ftfy's WIDTH_MAP: U+3000 -> space, and U+FF01..U+FFEF -> their NFKC form where that differs.
std::u32string fix_character_width(std::u32string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (char32_t c : text) {
    if (c == 0x3000) {
      out.push_back(U' ');
    } else if (c >= 0xFF01 && c <= 0xFFEF) {
      out += nfkc(std::u32string_view(&c, 1));
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::u32string uncurl_quotes(std::u32string_view text) {
  std::u32string out(text);
  for (auto& c : out) {
    if (c == 0x02BC || (c >= 0x2018 && c <= 0x201B))
      c = U'\'';
    else if (c >= 0x201C && c <= 0x201F)
      c = U'"';
  }
  return out;
}

std::u32string fix_line_breaks(std::u32string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char32_t c = text[i];
    if (c == U'\r') {
      out.push_back(U'\n');
      if (i + 1 < text.size() && text[i + 1] == U'\n') ++i;
    } else if (c == 0x2028 || c == 0x2029 || c == 0x85) {
      out.push_back(U'\n');
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// ANSI_RE = '\033\[((?:\d|;)*)([a-zA-Z])' (\d: any Unicode decimal digit, as in a Python str pattern).
std::u32string remove_terminal_escapes(std::u32string_view text) {
  std::u32string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == 0x1B && i + 1 < text.size() && text[i + 1] == U'[') {
      size_t j = i + 2;
      while (j < text.size() &&
             (text[j] == U';' || u_charType(static_cast<UChar32>(text[j])) == U_DECIMAL_DIGIT_NUMBER))
        ++j;
      const char32_t last = j < text.size() ? text[j] : 0;
      if ((last >= U'a' && last <= U'z') || (last >= U'A' && last <= U'Z')) {
        i = j + 1;
        continue;
      }
    }
    out.push_back(text[i++]);
  }
  return out;
}

bool is_removed_control(char32_t c) {
  return c <= 0x08 || c == 0x0B || (c >= 0x0E && c <= 0x1F) || c == 0x7F || (c >= 0x206A && c <= 0x206F) ||
         c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFC);
}

std::u32string remove_control_chars(std::u32string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (char32_t c : text)
    if (!is_removed_control(c)) out.push_back(c);
  return out;
}

// ftfy's fix_and_explain loop for one line. (fix_surrogates is left out: text decoded from UTF-8 has none.)
std::u32string fix_segment(std::u32string text, bool unescape) {
  while (true) {
    const std::u32string original = text;
    if (unescape) text = unescape_html(text);
    text = fix_encoding(text);
    text = fix_c1_controls(text);
    text = fix_latin_ligatures(text);
    text = fix_character_width(text);
    text = uncurl_quotes(text);
    text = fix_line_breaks(text);
    text = remove_terminal_escapes(text);
    text = remove_control_chars(text);
    text = nfc(text);
    if (text == original) return text;
  }
}

}  // namespace

std::u32string unescape_html(std::u32string_view text) {
  std::u32string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == U'&') {
      const bool numeric = i + 1 < text.size() && text[i + 1] == U'#';
      // With '#' first (the regex's greedy optional); "&#" followed by no alphanumerics cannot match without
      // it either, since '#' is not alphanumeric.
      const size_t body_start = i + (numeric ? 2 : 1);
      size_t j = body_start;
      while (j < text.size() && is_ascii_alnum(text[j])) ++j;
      const size_t len = j - body_start;
      if (len >= 1 && len <= 24 && j < text.size() && text[j] == U';') {
        out += unescape_one(text.substr(i, j + 1 - i), numeric, text.substr(body_start, len));
        i = j + 1;
        continue;
      }
    }
    out.push_back(text[i++]);
  }
  return out;
}

std::u32string fix_text(std::u32string_view text) {
  // As ftfy.fix_text: line by line (each segment keeps its '\n'), a line longer than kMaxSegmentLength in
  // pieces of that length; once a segment contains '<' the text is taken for HTML and entities are left alone
  // from there on.
  std::u32string out;
  out.reserve(text.size());
  bool unescape = true;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(U'\n', pos);
    end = std::min(end == std::u32string_view::npos ? text.size() : end + 1, pos + kMaxSegmentLength);
    std::u32string segment(text.substr(pos, end - pos));
    if (unescape && segment.find(U'<') != std::u32string::npos) unescape = false;
    out += fix_segment(std::move(segment), unescape);
    pos = end;
  }
  return out;
}

std::string fix_text(std::string_view utf8) { return u32_to_utf8(fix_text(utf8_to_u32(utf8))); }

}  // namespace sd::text
