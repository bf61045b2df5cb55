// ftfy 6.1's "badness" heuristic: does text contain a character sequence that is far likelier to be mojibake (UTF-8
// decoded in a legacy code page) than intended text, such as an accented letter followed by a currency sign?
#pragma once
#include <string_view>

namespace sd::text {

// ftfy.badness.is_bad: whether any of the heuristic's patterns occurs in `text`.
bool is_bad(std::u32string_view text);

}  // namespace sd::text
