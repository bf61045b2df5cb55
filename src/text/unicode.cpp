#include "text/unicode.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/locid.h>

#include "core/error.h"

namespace sd::text {

namespace {

icu::UnicodeString to_icu(std::u32string_view text) {
  return icu::UnicodeString::fromUTF32(reinterpret_cast<const UChar32*>(text.data()),
                                       static_cast<int32_t>(text.size()));
}

std::u32string from_icu(const icu::UnicodeString& s) {
  std::u32string out(static_cast<size_t>(s.countChar32()), U'\0');
  UErrorCode status = U_ZERO_ERROR;
  int32_t n = s.toUTF32(reinterpret_cast<UChar32*>(out.data()), static_cast<int32_t>(out.size()), status);
  SD_CHECK(U_SUCCESS(status), "ICU: UTF-32 conversion failed ({})", u_errorName(status));
  out.resize(static_cast<size_t>(n));
  return out;
}

std::u32string normalize(const icu::Normalizer2* normalizer, UErrorCode status, std::u32string_view text) {
  SD_CHECK(U_SUCCESS(status), "ICU: normalizer unavailable ({})", u_errorName(status));
  icu::UnicodeString out = normalizer->normalize(to_icu(text), status);
  SD_CHECK(U_SUCCESS(status), "ICU: normalization failed ({})", u_errorName(status));
  return from_icu(out);
}

}  // namespace

std::u32string utf8_to_u32(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b = s[i];
    if (b < 0x80) {
      out.push_back(b);
      ++i;
      continue;
    }
    int len = 0;
    char32_t cp = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte (rejects overlongs/surrogates)
    if (b >= 0xC2 && b <= 0xDF) {
      len = 2, cp = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3, cp = b & 0x0F;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4, cp = b & 0x07;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    } else {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    // As Python's decode(errors="replace"): a truncated or broken sequence becomes one U+FFFD for the bytes
    // that were valid so far; the offending byte is looked at again.
    size_t j = i + 1;
    bool ok = true;
    for (int k = 1; k < len; ++k, ++j) {
      const unsigned char c = j < n ? s[j] : 0;
      const unsigned char min = k == 1 ? lo : 0x80, max = k == 1 ? hi : 0xBF;
      if (j >= n || c < min || c > max) {
        ok = false;
        break;
      }
      cp = (cp << 6) | (c & 0x3F);
    }
    out.push_back(ok ? cp : 0xFFFD);
    i = j;
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string u32_to_utf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text) append_utf8(out, c);
  return out;
}

bool py_isspace(char32_t c) {
  // The fixed list CPython's _PyUnicode_IsWhitespace holds (stable since Unicode 6.3 dropped U+180E).
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  switch (c) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000: return true;
    default: return c >= 0x2000 && c <= 0x200A;
  }
}

bool is_letter(char32_t c) {
  const auto mask = U_GET_GC_MASK(static_cast<UChar32>(c));
  return (mask & U_GC_L_MASK) != 0;
}

bool is_number(char32_t c) {
  const auto mask = U_GET_GC_MASK(static_cast<UChar32>(c));
  return (mask & U_GC_N_MASK) != 0;
}

char32_t simple_case_fold(char32_t c) {
  return static_cast<char32_t>(u_foldCase(static_cast<UChar32>(c), U_FOLD_CASE_DEFAULT));
}

std::u32string py_lower(std::u32string_view text) {
  // Fast path: ASCII needs no tables (and is nearly every prompt).
  bool ascii = true;
  for (char32_t c : text)
    if (c >= 0x80) {
      ascii = false;
      break;
    }
  if (ascii) {
    std::u32string out(text);
    for (auto& c : out)
      if (c >= U'A' && c <= U'Z') c += 32;
    return out;
  }
  // The root locale gives the language-independent full mappings Python uses (no Turkish/Lithuanian rules).
  icu::UnicodeString s = to_icu(text);
  s.toLower(icu::Locale::getRoot());
  return from_icu(s);
}

std::u32string nfc(std::u32string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = icu::Normalizer2::getNFCInstance(status);
  return normalize(normalizer, status, text);
}

std::u32string nfkc(std::u32string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = icu::Normalizer2::getNFKCInstance(status);
  return normalize(normalizer, status, text);
}

}  // namespace sd::text
