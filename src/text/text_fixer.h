// ftfy.fix_text (6.1.1, default settings), which CLIPTokenizer applies to every prompt: HTML entity decoding,
// mojibake repair (text/mojibake.h), C1 controls, Latin ligatures, full/half width forms, curly quotes, line
// breaks, terminal escapes, control characters and NFC, repeated on each line until nothing changes.
#pragma once
#include <string>
#include <string_view>

namespace sd::text {

std::u32string fix_text(std::u32string_view text);
std::string fix_text(std::string_view utf8);

// ftfy's unescape_html alone: "&amp;" -> "&", "&#x2019;" -> "’", "&NTILDE;" -> "Ñ"; unknown names stay.
std::u32string unescape_html(std::u32string_view text);

}  // namespace sd::text
