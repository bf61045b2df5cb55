// Shard lists as WebDataset users write them: brace expansion as the braceexpand package (bash's rules) does,
// "data/{00000..00099}.tar", "{a,b}", several groups, nested groups; then shell globs ("data/*.tar") per result.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace sd::data {

// Brace expansion alone. {N..M} and {N..M..STEP} count up or down, zero-padded to the wider bound when either
// is written with a leading zero ("{07..10}" -> 07 08 09 10); {a..e} counts letters; {x,y} lists alternatives
// (which may themselves hold braces); a group is left as text when it is neither ("{x}"). Several groups give
// every combination, the first group varying slowest. A backslash escapes the next character.
// Throws sd::Error on unbalanced braces or a pattern expanding to more than a million names.
std::vector<std::string> expand_braces(const std::string& pattern);

// The shard files a pattern names, in order: brace expansion, then every name with a glob character (*?[)
// replaced by its matches in sorted order. Throws sd::Error (one line naming the pattern) when nothing matches,
// or naming the file when a name without glob characters does not exist.
std::vector<std::filesystem::path> resolve_shards(const std::string& pattern);

}  // namespace sd::data
