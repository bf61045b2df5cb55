#include "text/badness.h"

#include <unicode/uchar.h>

#include <vector>

#include "text/char_class.h"
#include "text/unicode.h"

namespace sd::text {

namespace {

// Python's \w in a str pattern: a letter, anything with a numeric value (so also "²" and "½"), or '_'.
bool is_python_word_char(char32_t c) {
  return c == U'_' || is_letter(c) || u_getIntPropertyValue(static_cast<UChar32>(c), UCHAR_NUMERIC_TYPE) != U_NT_NONE;
}

// The characters that occur in UTF-8 mojibake, by the role ftfy gives them (its MOJIBAKE_CATEGORIES).
struct MojibakeCategories {
  // No-break space, soft hyphen, and punctuation that is common in both intended text and mojibake.
  CharClass common{U"\u00A0\u00AD·´–—―…’"};
  CharClass c1{U"\u0080-\u009F"};                 // C1 controls: nothing but mojibake uses them any more
  CharClass bad{U"¦¤¨¬¯¶§¸ƒˆˇ˘˛˜†‡‰⌐◊\uFFFDªº"};  // nearly always mojibake
  CharClass currency{U"¢£¥₧€"};
  CharClass start_punctuation{U"¡«¿©΄΅‘‚“„•‹\uF8FF"};  // U+F8FF: the Apple logo in Apple's fonts
  CharClass end_punctuation{U"®»˝”›™"};
  CharClass numeric{U"²³¹±¼½¾×µ÷⁄∂∆∏∑√∞∩∫≈≠≡≤≥№"};
  CharClass kaomoji{U"Ò-ÖÙ-Üò-öø-üŐ°"};  // letters that emoticon faces are made of
  CharClass upper_accented{U"À-ÑØÜÝĂĄĆČĎĐĘĚĞİĹĽŁŃŇŒŘŚŞŠŢŤŮŰŸŹŻŽҐ"};
  CharClass lower_accented{U"ßà-ñăąćčďđęěğĺľłœŕśşšťüźżžґﬁﬂ"};
  CharClass upper_common{U"ÞΑ-ΩΆΈΉΊΌΎΏΪΫЁ-Я"};
  CharClass lower_common{U"α-ωάέήίΰа-џ"};
  CharClass box{U"│┌┐┘├┤┬┼═-╬▀▄█▌▐░▒▓"};
};

// ftfy's BADNESS_RE, one run per alternative: its "\s?" spelled out as two runs, its "^" alternative in at_start.
struct BadnessPatterns {
  std::vector<CharRun> anywhere;
  std::vector<CharRun> at_start;
};

BadnessPatterns make_badness_patterns() {
  const MojibakeCategories m;
  const CharClass space = CharClass::matching(py_isspace);
  const CharClass word = CharClass::matching(is_python_word_char);
  const CharClass any_but_newline = CharClass::all_except(U"\n");
  const CharClass ascii_lower{U"a-z"}, ascii_letter{U"a-zA-Z"};
  const CharClass accented = m.lower_accented + m.upper_accented;
  const CharClass a_hats{U"ÃÂ"}, space_only{U" "};
  const CharClass arabic_lead{U"ØÙ"};
  const CharClass arabic_follow =
      m.common + m.currency + m.bad + m.numeric + m.start_punctuation + CharClass(U"ŸŠ®°µ»");
  const CharClass cyrillic_1251{U"ВГРС"}, greek_1253{U"ΒΓΞΟ"};
  BadnessPatterns p;
  p.anywhere = {
      {m.c1},
      {m.bad + accented + m.box + m.start_punctuation + m.end_punctuation + m.currency + m.numeric, m.bad},
      {ascii_letter, m.lower_common + m.upper_common, m.bad},
      {m.bad, accented + m.box + m.start_punctuation + m.end_punctuation + m.currency + m.numeric},
      {m.lower_accented + m.lower_common + m.box + m.end_punctuation + m.currency + m.numeric, m.upper_accented},
      {m.box + m.end_punctuation + m.currency + m.numeric, m.lower_accented},
      // ftfy leaves out [upper_accented][currency]: fancy leetspeak-like writing uses it.
      {m.lower_accented + m.box + m.end_punctuation, m.currency},
      {space, m.upper_accented, m.currency},
      {m.upper_accented + m.box, m.numeric},
      {accented + m.box + m.currency + m.end_punctuation, m.start_punctuation, m.numeric},
      {accented + m.currency + m.numeric + m.box, m.end_punctuation, m.start_punctuation},
      {m.currency + m.numeric + m.box, m.start_punctuation},
      {ascii_lower, m.upper_accented, m.start_punctuation + m.currency},
      {m.box, m.kaomoji},
      {accented + m.currency + m.numeric + m.start_punctuation + m.end_punctuation, m.box},
      {m.box, m.end_punctuation},
      {accented, m.end_punctuation, word},
      // The ligature œ when not followed by an unaccented Latin letter.
      {CharClass(U"Œœ"), CharClass::all_except(U"A-Za-z")},
      // Common Windows-1252 two-character mojibake the rules above miss.
      {CharClass(U"ÂÃÎÐ"), CharClass(U"€Šš¢£Ÿž\u00A0\u00AD®©°·»–—´") + m.start_punctuation + m.end_punctuation},
      {CharClass(U"×"), CharClass(U"²³")},
      // Windows-1252 mojibake of Arabic involves 'common' characters, so four characters are required.
      {arabic_lead, arabic_follow, arabic_lead, arabic_follow},
      // Windows-1252 mojibake starting three-byte sequences of South Asian scripts.
      {CharClass(U"à"), CharClass(U"²µ¹¼½¾")},
      // MacRoman mojibake.
      {CharClass(U"√"), CharClass(U"±∂†≠®™´≤≥¥µø")},
      {CharClass(U"≈"), CharClass(U"°¢")},
      {CharClass(U"‚"), CharClass(U"Ä"), CharClass(U"ìîïòôúùû†°¢π")},
      {CharClass(U"‚"), CharClass(U"âó"), CharClass(U"àä°ê")},
      // Windows-1251 mojibake of the U+2000 block.
      {CharClass(U"в"), CharClass(U"Ђ")},
      // Windows-1251 mojibake of Latin-1 or Cyrillic: two-character sequences would be too common, so three.
      {cyrillic_1251, m.c1 + m.bad + m.start_punctuation + m.end_punctuation + m.currency + CharClass(U"°µ"),
       cyrillic_1251},
      // Windows-1251 mojibake on top of Latin-1 mojibake of Windows-1252 punctuation, next to Latin text.
      {CharClass(U"Г"), CharClass(U"ў"), CharClass(U"В"), CharClass(U"Ђ"), CharClass(U"В"), any_but_newline,
       CharClass(U"A-Za-z ")},
      // Windows-1252 mojibake of 'à', 'á' and U+00A0 itself.
      {CharClass(U"Ã"), CharClass(U"\u00A0¡")},
      {ascii_lower, a_hats, space_only},
      {ascii_lower, space, a_hats, space_only},
      // Â in front of the very character it would encode.
      {ascii_lower + CharClass(U".,?!") + m.end_punctuation, CharClass(U"Â"),
       space_only + m.start_punctuation + m.end_punctuation},
      // Windows-1253 mojibake of the U+2000 block.
      {CharClass(U"β"), CharClass(U"€"), CharClass(U"™\u00A0Ά\u00AD®°")},
      // Windows-1253 mojibake of Latin-1 or Greek.
      {greek_1253, m.c1 + m.bad + m.start_punctuation + m.end_punctuation + m.currency + CharClass(U"°"), greek_1253},
  };
  p.at_start = {{a_hats, space_only}};
  return p;
}

}  // namespace

bool is_bad(std::u32string_view text) {
  static const BadnessPatterns patterns = make_badness_patterns();
  if (!text.empty() && first_match_at(patterns.at_start, text, 0)) return true;
  for (size_t pos = 0; pos < text.size(); ++pos)
    if (first_match_at(patterns.anywhere, text, pos)) return true;
  return false;
}

}  // namespace sd::text
