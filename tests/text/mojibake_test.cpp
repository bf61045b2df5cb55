#include "text/mojibake.h"

#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "test_util.h"
#include "text/badness.h"
#include "text/char_class.h"
#include "text/code_pages.h"
#include "text/text_fixer.h"
#include "text/unicode.h"

namespace sd::text {
namespace {

using nlohmann::json;

std::string fix_encoding_utf8(const std::string& text) { return u32_to_utf8(fix_encoding(utf8_to_u32(text))); }

TEST(Mojibake, FixTextAndFixEncodingMatchFtfyOnItsTestCasesAndGeneratedMojibake) {
  // ftfy's own test cases, each with one more layer of mojibake, its documentation examples and generated mojibake
  // through every code page, with what ftfy 6.1.1 made of them (see tests/fixtures/ftfy/README.md).
  const json data = json::parse(io::read_text_file(sd::test::fixtures() / "ftfy" / "ftfy_cases.json"));
  ASSERT_GE(data["cases"].size(), 500u);
  for (const json& c : data["cases"]) {
    const std::string original = c["original"].get<std::string>();
    SCOPED_TRACE(c["label"].get<std::string>() + ": " + original);
    EXPECT_EQ(fix_text(original), c["fix_text"].get<std::string>());
    EXPECT_EQ(fix_encoding_utf8(original), c["fix_encoding"].get<std::string>());
  }
}

TEST(Mojibake, UndoesUtf8ReadAsWindows1252) {
  EXPECT_EQ(fix_text("schÃ¶n"), "schön");
  EXPECT_EQ(fix_encoding_utf8("doesnÃ¢â‚¬â„¢t"), "doesn’t");  // two layers
  EXPECT_EQ(fix_text("doesnÃ¢â‚¬â„¢t"), "doesn't");           // and fix_text uncurls the quote
  EXPECT_EQ(fix_encoding_utf8("Ã˜Â§Ã™â€žÃ˜Â¹Ã˜Â±Ã˜Â¨Ã™Å Ã˜Â©"),
            "العربية");  // Arabic, whose mojibake is 'common' characters
}

TEST(Mojibake, LeavesIntendedTextAlone) {
  for (const char* text : {"naïve café", "Türkçe", "Straße", "IL Y MARQUÉ…", "2 × 3 ≥ 5", "日本語", "русский",
                           "¯\\_(ツ)_/¯", "(╯°□°)╯︵ ┻━┻"}) {
    EXPECT_FALSE(is_bad(utf8_to_u32(text))) << text;
    EXPECT_EQ(fix_encoding_utf8(text), text);
  }
}

TEST(Mojibake, RestoresNoBreakSpaceBytesThatBecameSpaces) {
  // "à" is C3 A0 in UTF-8; Windows-1252 shows A0 as a no-break space, which often became a plain space.
  EXPECT_EQ(fix_text("voilÃ le travail"), "voilà le travail");
  EXPECT_EQ(fix_text("Ã perturber la rÃ©flexion"), "à perturber la réflexion");
}

TEST(Mojibake, LostBytesBecomeOneReplacementCharacter) {
  // Windows-1252 (not sloppy) turned the unassigned byte 9D of the closing quote into U+FFFD.
  EXPECT_EQ(fix_encoding_utf8("â€œ like this â€\uFFFD"), "“ like this \uFFFD");
}

TEST(Mojibake, MixedEncodingsAreFixedPieceByPiece) {
  // No single re-encoding fixes both halves; decode_inconsistent_utf8 fixes each garbled run on its own.
  EXPECT_EQ(fix_text("l’humanitÃ©"), "l'humanité");
}

TEST(Mojibake, C1ControlsBecomeWindows1252) {
  EXPECT_EQ(fix_text("\u0093quoted\u0094 \u0080 5"), "\"quoted\" € 5");
  // Bytes Windows-1252 leaves unassigned (81, 8D, 8F, 90, 9D) stay.
  EXPECT_EQ(fix_c1_controls(U"\u0081\u0085"), U"\u0081\u2026");
}

TEST(CodePages, EveryByteRoundTrips) {
  for (const CodePage& page : mojibake_code_pages()) {
    for (int b = 0; b < 256; ++b) {
      const char32_t c = page.decode(static_cast<uint8_t>(b));
      EXPECT_EQ(page.encode(std::u32string(1, c)), std::string(1, static_cast<char>(b))) << page.name() << " " << b;
    }
  }
}

TEST(CodePages, SloppyPagesSpendByte1AOnTheReplacementCharacter) {
  const CodePage& cp1252 = sloppy_windows_1252();
  EXPECT_EQ(cp1252.encode(U"a\uFFFD"), std::string("a\x1a"));
  EXPECT_EQ(cp1252.encode(U"\u001A"), std::nullopt);
  EXPECT_EQ(cp1252.decode(0x81), U'\u0081');  // unassigned in Windows-1252
  EXPECT_EQ(cp1252.encode(U"日"), std::nullopt);
  EXPECT_EQ(mojibake_code_pages()[0].encode(U"\u001A\u00FF"), std::string("\x1a\xff"));  // latin-1
}

TEST(CodePages, Utf8VariantsAcceptsCesu8AndJavaNullAndNothingElseInvalid) {
  EXPECT_EQ(decode_utf8_variants("\xed\xa6\x9d\xed\xbd\xb7 and \xc0\x80"), std::u32string(U"\U00077777 and \0", 7));
  EXPECT_EQ(decode_utf8_variants("caf\xc3\xa9 \xed\x95\x9c"), U"café 한");  // ED starts Hangul too
  EXPECT_EQ(decode_utf8_variants("\xed\xa0\x80"), std::nullopt);            // a lone surrogate
  EXPECT_EQ(decode_utf8_variants("\xc0\xaf"), std::nullopt);                // overlong '/'
  EXPECT_EQ(decode_utf8_variants("\xe2\x82"), std::nullopt);                // truncated
  EXPECT_EQ(decode_utf8_variants("\xf4\x90\x80\x80"), std::nullopt);        // beyond U+10FFFF
}

TEST(CharClass, RangesUnionsAndComplements) {
  const CharClass letters(U"a-cx");
  EXPECT_TRUE(letters.contains(U'b'));
  EXPECT_TRUE(letters.contains(U'x'));
  EXPECT_FALSE(letters.contains(U'd'));
  const CharClass with_space = letters + CharClass::matching(py_isspace);
  EXPECT_TRUE(with_space.contains(U'\u3000'));
  const CharClass not_letters = CharClass::all_except(U"a-cx");
  EXPECT_FALSE(not_letters.contains(U'a'));
  EXPECT_TRUE(not_letters.contains(U'y'));
  EXPECT_TRUE(not_letters.contains(U'\U0010FFFF'));
  EXPECT_TRUE(CharClass::bytes("\x80-\xbf").contains(0xA0));
  EXPECT_TRUE(matches_at(CharRun{CharClass(U"x"), CharClass(U"y")}, std::u32string(U"axy"), 1));
  EXPECT_FALSE(matches_at(CharRun{CharClass(U"x"), CharClass(U"y")}, std::u32string(U"axy"), 2));
}

}  // namespace
}  // namespace sd::text
