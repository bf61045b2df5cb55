// The byte encodings ftfy's mojibake repair re-encodes text through: single-byte code pages (with ftfy's "sloppy"
// filling of unassigned bytes) and ftfy's lenient "utf-8-variants" decoder.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace sd::text {

// Bytes 0x00..0x7F are ASCII; 0x80..0xFF map through a table.
class CodePage {
 public:
  // `sloppy`: as ftfy's sloppy codecs, byte 0x1A stands for U+FFFD (so a character lost to U+FFFD can still be
  // re-encoded), and U+001A itself has no byte.
  CodePage(std::string name, const std::array<char32_t, 128>& high_half, bool sloppy);

  const std::string& name() const { return name_; }
  bool is_sloppy() const { return sloppy_; }
  char32_t decode(uint8_t byte) const;
  // The bytes of `text`, or nullopt when a character has no byte in this code page (ftfy's possible_encoding).
  std::optional<std::string> encode(std::u32string_view text) const;

 private:
  std::string name_;
  std::array<char32_t, 128> high_half_;
  bool sloppy_;
  std::unordered_map<char32_t, uint8_t> byte_of_;  // the characters of bytes 0x80..0xFF (and U+FFFD when sloppy)
};

// ftfy's CHARMAP_ENCODINGS in the order it tries them: latin-1, sloppy-windows-1252, -1251, -1250, -1253, -1254,
// iso-8859-2, macroman, cp437.
const std::vector<CodePage>& mojibake_code_pages();
const CodePage& sloppy_windows_1252();

// Strict UTF-8 that also accepts what ftfy's "utf-8-variants" codec does: CESU-8 (a character beyond U+FFFF as
// two encoded UTF-16 surrogates) and Java's C0 80 for U+0000. nullopt where Python would raise
// UnicodeDecodeError (invalid or truncated sequences, lone surrogates, overlong forms).
std::optional<std::u32string> decode_utf8_variants(std::string_view bytes);

}  // namespace sd::text
