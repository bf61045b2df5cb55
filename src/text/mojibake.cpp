#include "text/mojibake.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "text/badness.h"
#include "text/char_class.h"
#include "text/code_pages.h"

namespace sd::text {

namespace {

bool is_ascii(std::u32string_view text) {
  return std::all_of(text.begin(), text.end(), [](char32_t c) { return c < 0x80; });
}

// --- Byte-level repairs, applied to the re-encoded bytes before they are read as UTF-8 ---

// Where UTF-8 would be valid but for a byte A0 that some program turned into a plain space (ftfy's
// ALTERED_UTF8_RE). Only lead bytes whose A0 sequence forms a likely character take part.
const std::vector<CharRun>& altered_utf8_runs() {
  static const std::vector<CharRun> runs = [] {
    const CharClass space = CharClass::bytes(" ");
    const CharClass continuation = CharClass::bytes("\x80-\xbf");
    const CharClass continuation_not_85_a0 = CharClass::bytes("\x80-\x84\x86-\x9f\xa1-\xbf");
    const CharClass f0 = CharClass::bytes("\xf0");
    return std::vector<CharRun>{
        {CharClass::bytes("\xc2\xc3\xc5\xce\xd0\xd9"), space},
        {CharClass::bytes("\xe2\xe3"), space, continuation_not_85_a0},
        {CharClass::bytes("\xe0-\xe3"), continuation_not_85_a0, space},
        {f0, space, continuation, continuation},
        {f0, continuation, space, continuation},
        {f0, continuation, continuation, space},
    };
  }();
  return runs;
}

bool has_altered_utf8(const std::string& bytes) {
  for (size_t pos = 0; pos < bytes.size(); ++pos)
    if (first_match_at(altered_utf8_runs(), bytes, pos)) return true;
  return false;
}

// "Ã " standing alone is nearly always "à" whose A0 byte became a space, so it gets its A0 back and keeps the
// space ("Ã la mode" -> "à la mode", not "àla mode"). Portuguese "às", "àquele", "àquela", "àquilo" are
// exceptions (ftfy's A_GRAVE_WORD_RE).
bool is_a_grave_word_at(const std::string& bytes, size_t pos) {
  if (bytes.compare(pos, 2, "\xc3 ") != 0) return false;
  const std::string_view rest = std::string_view(bytes).substr(pos + 2);
  for (std::string_view exception : {" ", "quele", "quela", "quilo", "s "})
    if (rest.substr(0, exception.size()) == exception) return false;
  return true;
}

// ftfy's restore_byte_a0.
std::string restore_byte_a0(const std::string& bytes) {
  std::string with_a_grave;
  for (size_t pos = 0; pos < bytes.size();) {
    if (is_a_grave_word_at(bytes, pos)) {
      with_a_grave += "\xc3\xa0 ";
      pos += 2;
    } else {
      with_a_grave.push_back(bytes[pos++]);
    }
  }
  std::string out;
  for (size_t pos = 0; pos < with_a_grave.size();) {
    const CharRun* run = first_match_at(altered_utf8_runs(), with_a_grave, pos);
    const size_t length = run ? run->size() : 1;
    for (size_t i = pos; i < pos + length; ++i) out.push_back(run && with_a_grave[i] == ' ' ? '\xa0' : with_a_grave[i]);
    pos += length;
  }
  return out;
}

// UTF-8 sequences some of whose bytes were lost: a sloppy code page encodes U+FFFD as byte 1A, and an ASCII '?'
// may stand in for a lost byte once per sequence (ftfy's LOSSY_UTF8_RE, alternatives in its order).
const std::vector<CharRun>& lossy_utf8_runs() {
  static const std::vector<CharRun> runs = [] {
    const CharClass lost = CharClass::bytes("\x1a");
    const CharClass lost_or_question = CharClass::bytes("\x1a?");
    const CharClass lost_or_continuation = CharClass::bytes("\x1a\x80-\xbf");
    const CharClass any_continuation = CharClass::bytes("\x1a?\x80-\xbf");
    const CharClass ed = CharClass::bytes("\xed");
    const CharClass high_surrogate = CharClass::bytes("\xa0-\xaf"), low_surrogate = CharClass::bytes("\xb0-\xbf");
    const CharClass lead2 = CharClass::bytes("\xc2-\xdf"), lead3 = CharClass::bytes("\xe0-\xef"),
                    lead4 = CharClass::bytes("\xf0-\xf4");
    return std::vector<CharRun>{
        {lead2, lost},
        {CharClass::bytes("\xc2\xc3"), CharClass::bytes("?")},
        {ed, high_surrogate, lost_or_question, ed, low_surrogate, any_continuation},
        {ed, high_surrogate, any_continuation, ed, low_surrogate, lost_or_question},
        {lead3, lost_or_question, lost_or_continuation},
        {lead3, lost_or_continuation, lost_or_question},
        {lead4, lost_or_question, lost_or_continuation, lost_or_continuation},
        {lead4, lost_or_continuation, lost_or_question, lost_or_continuation},
        {lead4, lost_or_continuation, lost_or_continuation, lost_or_question},
        {lost},
    };
  }();
  return runs;
}

// ftfy's replace_lossy_sequences: each such sequence becomes the UTF-8 of U+FFFD.
std::string replace_lossy_sequences(const std::string& bytes) {
  std::string out;
  for (size_t pos = 0; pos < bytes.size();) {
    if (const CharRun* run = first_match_at(lossy_utf8_runs(), bytes, pos)) {
      out += "\xef\xbf\xbd";
      pos += run->size();
    } else {
      out.push_back(bytes[pos++]);
    }
  }
  return out;
}

// The text's bytes in `page`, repaired and read as UTF-8 (or nullopt if they are not UTF-8 even then).
std::optional<std::u32string> reread_as_utf8(std::string bytes, const CodePage& page) {
  if (has_altered_utf8(bytes)) bytes = restore_byte_a0(bytes);
  if (page.is_sloppy()) bytes = replace_lossy_sequences(bytes);
  // ftfy picks its "utf-8-variants" codec only when bytes ED or C0 occur; without them it decodes as plain UTF-8.
  return decode_utf8_variants(bytes);
}

// --- Mojibake embedded in otherwise fine text ---

// Runs of characters that look like UTF-8 sequences decoded one byte per character (ftfy's UTF8_DETECTOR_RE):
// a lead character followed by 1, 2 or 3 continuation characters, repeated.
struct Utf8Clues {
  std::vector<CharRun> sequences;  // in the regex's order: 2-, 3-, then 4-byte sequences
  CharClass continuation_strict;   // continuation characters that never stand for themselves next to mojibake
};

const Utf8Clues& utf8_clues() {
  static const Utf8Clues clues = [] {
    // Letters that bytes C2..DF, E0..EF and F0..F4 decode to in the code pages above.
    const CharClass first_of_2{
        U"ÂÃÄÅÆÇÈÉÊËÌÍÎÏÐÑÒÓÔÕÖ×ØÙÚÛÜÝÞßĂĆČĎĐĘĚĞİĹŃŇŐŘŞŢŮŰ"
        U"ΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥΦΧΨΩΪΫάέήίВГДЕЖЗИЙКЛМНОПРСТУФХЦЧШЩЪЫЬЭЮЯ"};
    const CharClass first_of_3{U"àáâãäåæçèéêëìíîïăćčďęěĺŕΰαβγδεζηθικλμνξοабвгдежзийклмноп"};
    const CharClass first_of_4{U"ðóđğπσру"};
    // What bytes 80..BF decode to, except spaces, dashes, quotes and ellipses.
    const CharClass continuation_strict{
        U"\u0080-\u00BFĄąĽľŁłŒœŚśŞşŠšŤťŸŹźŻżŽžƒˆˇ˘˛˜˝΄΅ΆΈΉΊΌΎΏЁЂЃЄЅІЇЈЉЊЋЌЎЏёђѓєѕіїјљњћќўџҐґ†‡•‰‹›€№™"};
    // A space may stand for a byte A0 that was turned into one.
    const CharClass continuation = continuation_strict + CharClass(U"–—―‘’‚“”„… ");
    return Utf8Clues{{{first_of_2, continuation},
                      {first_of_3, continuation, continuation},
                      {first_of_4, continuation, continuation, continuation}},
                     continuation_strict};
  }();
  return clues;
}

// Length of the clue run that starts at `pos`, 0 if none does. Greedy, taking at each step the first sequence
// that matches, as Python's regex does for "(A|B|C)+" with nothing after it.
size_t utf8_clue_run_at(const std::u32string& text, size_t pos) {
  const Utf8Clues& clues = utf8_clues();
  // The lookbehind: not right after a strict continuation character, so a few characters inside a larger garble
  // are not "fixed" into something worse.
  if (pos > 0 && clues.continuation_strict.contains(text[pos - 1])) return 0;
  size_t end = pos;
  while (const CharRun* run = first_match_at(clues.sequences, text, end)) end += run->size();
  return end - pos;
}

bool has_utf8_clues(const std::u32string& text) {
  for (size_t pos = 0; pos < text.size(); ++pos)
    if (utf8_clue_run_at(text, pos) > 0) return true;
  return false;
}

// ftfy's decode_inconsistent_utf8: fixes each clue run on its own when it looks bad by itself, for text that mixes
// mojibake with text no single re-encoding can fix. A run as long as the whole text is left alone, so this never
// recurses into the same problem.
std::u32string decode_inconsistent_utf8(const std::u32string& text) {
  std::u32string out;
  for (size_t pos = 0; pos < text.size();) {
    const size_t length = utf8_clue_run_at(text, pos);
    if (length == 0) {
      out.push_back(text[pos++]);
      continue;
    }
    const std::u32string_view run = std::u32string_view(text).substr(pos, length);
    out += length < text.size() && is_bad(run) ? fix_encoding(run) : std::u32string(run);
    pos += length;
  }
  return out;
}

// ftfy's _fix_encoding_one_step_and_explain with default settings.
std::u32string fix_encoding_step(const std::u32string& text) {
  if (is_ascii(text) || !is_bad(text)) return text;
  // UTF-8 read in a single-byte code page: the first code page that can re-encode the text into bytes that are
  // (repaired) UTF-8 wins.
  for (const CodePage& page : mojibake_code_pages()) {
    if (std::optional<std::string> bytes = page.encode(text))
      if (std::optional<std::u32string> fixed = reread_as_utf8(std::move(*bytes), page)) return *fixed;
  }
  if (has_utf8_clues(text)) {
    std::u32string fixed = decode_inconsistent_utf8(text);
    if (fixed != text) return fixed;
  }
  // ftfy now tries Latin-1 text meant as Windows-1252 (re-decoding it strictly as Windows-1252), and failing that
  // reads each C1 control as its sloppy Windows-1252 character. Both change exactly the C1 controls, in the same
  // way, and nothing else, so the second alone gives the same text.
  return fix_c1_controls(text);
}

}  // namespace

std::u32string fix_encoding(std::u32string_view text) {
  std::u32string current(text);
  while (true) {
    std::u32string next = fix_encoding_step(current);
    if (next == current) return next;
    current = std::move(next);
  }
}

std::u32string fix_c1_controls(std::u32string_view text) {
  std::u32string out(text);
  for (char32_t& c : out)
    if (c >= 0x80 && c <= 0x9F) c = sloppy_windows_1252().decode(static_cast<uint8_t>(c));
  return out;
}

}  // namespace sd::text
