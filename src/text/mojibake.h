// ftfy 6.1's mojibake repair (fix_encoding, default settings): text that was encoded as UTF-8 and decoded in a
// legacy code page ("schÃ¶n") is re-encoded in that code page and decoded as UTF-8 again ("schön"), when its
// badness heuristic says the text looks like mojibake.
#pragma once
#include <string>
#include <string_view>

namespace sd::text {

// ftfy.fix_encoding: repeats fix_encoding's single step until the text stops changing.
std::u32string fix_encoding(std::u32string_view text);

// ftfy.fixes.fix_c1_controls: each C1 control character (U+0080..U+009F) becomes the Windows-1252 character of
// that byte, as web browsers read them ("\x93" -> "“"); the five bytes Windows-1252 leaves unassigned stay.
std::u32string fix_c1_controls(std::u32string_view text);

}  // namespace sd::text
