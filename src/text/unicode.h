// Unicode helpers for the CLIP tokenizer: UTF-8 <-> code points, and the character properties and
// transforms Python's str/re/regex/unicodedata apply (isspace, lower, \p{L}, \p{N}, NFC), backed by ICU.
#pragma once
#include <string>
#include <string_view>

namespace sd::text {

// Decodes UTF-8. Invalid bytes become U+FFFD (one per byte that cannot start or continue a sequence), so a
// caption file with a stray Latin-1 byte still tokenizes instead of aborting a training run.
std::u32string utf8_to_u32(std::string_view text);
std::string u32_to_utf8(std::u32string_view text);
void append_utf8(std::string& out, char32_t c);

// Python's str.isspace() (also what `re`'s \s matches in a str pattern): bidi class WS/B/S or category Zs.
bool py_isspace(char32_t c);
// regex's \p{L} (general category L*) and \p{N} (Nd, Nl, No).
bool is_letter(char32_t c);
bool is_number(char32_t c);
// Simple case folding, what `regex` with IGNORECASE compares.
char32_t simple_case_fold(char32_t c);

// Python's str.lower(): full lower-case mappings (e.g. U+0130 -> "i̇") with the Final_Sigma rule.
std::u32string py_lower(std::u32string_view text);
// unicodedata.normalize("NFC"/"NFKC", text).
std::u32string nfc(std::u32string_view text);
std::u32string nfkc(std::u32string_view text);

}  // namespace sd::text
