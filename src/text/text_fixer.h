// The part of ftfy.fix_text (6.1, default settings) that CLIPTokenizer applies to every prompt: HTML entity
// decoding, C1 controls, Latin ligatures, full/half width forms, curly quotes, line breaks, terminal escapes,
// control characters and NFC, repeated until nothing changes. Mojibake repair (ftfy's fix_encoding, a
// statistical guess over re-encodings) is deliberately left out: text that is valid UTF-8 passes through it
// unchanged unless it already looks like mis-decoded UTF-8.
#pragma once
#include <string>
#include <string_view>

namespace sd::text {

std::u32string fix_text(std::u32string_view text);
std::string fix_text(std::string_view utf8);

// ftfy's unescape_html alone: "&amp;" -> "&", "&#x2019;" -> "’", "&NTILDE;" -> "Ñ"; unknown names stay.
std::u32string unescape_html(std::u32string_view text);

}  // namespace sd::text
