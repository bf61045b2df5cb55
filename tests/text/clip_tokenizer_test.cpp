#include "text/clip_tokenizer.h"

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/atomic_file.h"
#include "test_util.h"
#include "text/text_fixer.h"

namespace sd::text {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using sd::test::TempDir;

fs::path tokenizer_dir(const std::string& pipeline) { return sd::test::fixtures() / pipeline / "tokenizer"; }

const json& cases() {
  static const json data = json::parse(io::read_text_file(sd::test::golden("tokenizer_cases.json")));
  return data;
}

using sd::test::error_of;

// The golden cases were made after add_tokens(["<dicoo>"]).
ClipTokenizer golden_tokenizer(const std::string& pipeline) {
  ClipTokenizer tok = ClipTokenizer::load(tokenizer_dir(pipeline));
  EXPECT_EQ(tok.add_token("<dicoo>"), 49408);
  return tok;
}

void check_golden_cases(const std::string& pipeline, const std::string& key) {
  const ClipTokenizer tok = golden_tokenizer(pipeline);
  ASSERT_EQ(cases()["cases"].size(), 40u);
  for (const json& c : cases()["cases"]) {
    const std::string prompt = c["prompt"].get<std::string>();
    const json& expected = c[key];
    SCOPED_TRACE("case " + std::to_string(c["id"].get<int>()) + ": " + prompt);
    const ClipEncoding enc = tok.encode_full(prompt);
    EXPECT_EQ(enc.input_ids, expected["input_ids"].get<std::vector<int64_t>>());
    EXPECT_EQ(enc.attention_mask, expected["attention_mask"].get<std::vector<int64_t>>());
    EXPECT_EQ(enc.n_tokens_before_truncation, expected["n_tokens_before_truncation"].get<int64_t>());
    EXPECT_EQ(enc.truncated, expected["truncated"].get<bool>());
    EXPECT_EQ(tok.tokenize(prompt), expected["tokens"].get<std::vector<std::string>>());
    EXPECT_EQ(tok.encode(prompt), enc.input_ids);
  }
}

TEST(ClipTokenizer, GoldenCasesSd1) { check_golden_cases("tiny-sd1", "sd1"); }
TEST(ClipTokenizer, GoldenCasesSd2) { check_golden_cases("tiny-sd2", "sd2"); }

TEST(ClipTokenizer, TextFixerMatchesFtfyOnGoldenPrompts) {
  for (const json& c : cases()["cases"])
    EXPECT_EQ(fix_text(c["prompt"].get<std::string>()), c["ftfy_fix_text"].get<std::string>()) << c["prompt"];
}

TEST(ClipTokenizer, SpecialTokensAndSizes) {
  const ClipTokenizer sd1 = ClipTokenizer::load(tokenizer_dir("tiny-sd1"));
  EXPECT_EQ(sd1.bos_token_id(), 49406);
  EXPECT_EQ(sd1.eos_token_id(), 49407);
  EXPECT_EQ(sd1.pad_token_id(), 49407);
  EXPECT_EQ(sd1.model_max_length(), 77);
  EXPECT_EQ(sd1.size(), 49408u);
  const ClipTokenizer sd2 = ClipTokenizer::load(tokenizer_dir("tiny-sd2"));
  EXPECT_EQ(sd2.pad_token_id(), 0);
  EXPECT_EQ(sd2.size(), 49408u);  // "!" is an added token but already in the vocabulary
  EXPECT_EQ(sd2.token_to_id("!"), 0);
  EXPECT_EQ(sd2.token_to_id("!</w>"), 256);
  EXPECT_FALSE(sd2.token_to_id("<dicoo>").has_value());
}

TEST(ClipTokenizer, RepoVocabularyWithoutConfigUsesClipDefaults) {
  const ClipTokenizer tok =
      ClipTokenizer::load(sd::test::fixtures().parent_path().parent_path() / "assets" / "clip-vocab");
  const std::vector<int64_t> ids = tok.encode("a photo of a cat");
  ASSERT_EQ(ids.size(), 77u);
  EXPECT_EQ(std::vector<int64_t>(ids.begin(), ids.begin() + 8),
            (std::vector<int64_t>{49406, 320, 1125, 539, 320, 2368, 49407, 49407}));
  EXPECT_EQ(tok.pad_token_id(), 49407);
}

TEST(ClipTokenizer, UpperCaseEndOfTextStillMapsToEos) {
  // Not an added-token match (case-sensitive), but lower-casing happens before the CLIP regex, whose first
  // alternatives are the two markers, and BPE's cache passes them through.
  const ClipTokenizer tok = ClipTokenizer::load(tokenizer_dir("tiny-sd1"));
  EXPECT_EQ(tok.encode_tokens("a <|ENDOFTEXT|>"), (std::vector<int64_t>{320, 49407}));
  EXPECT_EQ(tok.tokenize("<|StartOfText|>x"), (std::vector<std::string>{"<|startoftext|>", "x</w>"}));
}

TEST(ClipTokenizer, AddedTokensMatchExactlyAndTakeNextIds) {
  ClipTokenizer tok = ClipTokenizer::load(tokenizer_dir("tiny-sd1"));
  EXPECT_EQ(tok.add_token("<cat-toy>"), 49408);
  EXPECT_EQ(tok.add_token("<cat-toy-2>"), 49409);
  EXPECT_EQ(tok.size(), 49410u);
  // Longest match wins; matching is case-sensitive; no spaces needed around the token.
  EXPECT_EQ(
      tok.tokenize("a<cat-toy-2>b <CAT-TOY>"),
      (std::vector<std::string>{"a</w>", "<cat-toy-2>", "b</w>", "<</w>", "cat</w>", "-</w>", "toy</w>", "></w>"}));
  EXPECT_EQ(tok.encode_tokens("a<cat-toy-2>b")[1], 49409);
  EXPECT_EQ(tok.decode(tok.encode("a <cat-toy> on a table")), "a <cat-toy> on a table");
}

TEST(ClipTokenizer, AddingAKnownTokenIsAnError) {
  ClipTokenizer tok = ClipTokenizer::load(tokenizer_dir("tiny-sd2"));
  EXPECT_EQ(error_of([&] { tok.add_token("cat"); }), "token 'cat' is already in the tokenizer's vocabulary");
  EXPECT_EQ(error_of([&] { tok.add_token("!"); }), "token '!' is already in the tokenizer's vocabulary");
  EXPECT_EQ(error_of([&] { tok.add_token("<|endoftext|>"); }),
            "token '<|endoftext|>' is already in the tokenizer's vocabulary");
  tok.add_token("<dicoo>");
  EXPECT_EQ(error_of([&] { tok.add_token("<dicoo>"); }), "token '<dicoo>' is already in the tokenizer's vocabulary");
  EXPECT_NE(error_of([&] { tok.add_token(""); }), "");
}

TEST(ClipTokenizer, SaveWritesTransformersFilesByteForByte) {
  for (const std::string pipeline : {"tiny-sd1", "tiny-sd2"}) {
    TempDir dir;
    ClipTokenizer::load(tokenizer_dir(pipeline)).save(dir.path());
    for (const char* file : {"vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"})
      EXPECT_EQ(io::read_text_file(dir.path() / file), io::read_text_file(tokenizer_dir(pipeline) / file))
          << pipeline << "/" << file;
    EXPECT_FALSE(fs::exists(dir.path() / "added_tokens.json"));
  }
}

TEST(ClipTokenizer, SaveLoadRoundTripKeepsAddedTokens) {
  TempDir dir;
  ClipTokenizer tok = golden_tokenizer("tiny-sd2");
  EXPECT_EQ(tok.add_token("<other>"), 49409);
  tok.save(dir.path());
  const json config = json::parse(io::read_text_file(dir.path() / "tokenizer_config.json"));
  EXPECT_EQ(config["added_tokens_decoder"]["49408"], (json{{"content", "<dicoo>"},
                                                           {"lstrip", false},
                                                           {"normalized", true},
                                                           {"rstrip", false},
                                                           {"single_word", false},
                                                           {"special", false}}));
  EXPECT_EQ(config["added_tokens_decoder"]["0"]["content"], "!");
  EXPECT_EQ(io::read_text_file(dir.path() / "added_tokens.json"),
            "{\n  \"<dicoo>\": 49408,\n  \"<other>\": 49409\n}\n");

  const ClipTokenizer again = ClipTokenizer::load(dir.path());
  EXPECT_EQ(again.token_to_id("<dicoo>"), 49408);
  EXPECT_EQ(again.token_to_id("<other>"), 49409);
  EXPECT_EQ(again.size(), tok.size());
  EXPECT_EQ(again.pad_token_id(), 0);
  for (const std::string prompt : {"a <dicoo> next to <other>!", "wow! amazing!!", "a photo of a cat"})
    EXPECT_EQ(again.encode(prompt), tok.encode(prompt)) << prompt;

  // Only added_tokens.json (older transformers): ids still come back.
  TempDir legacy;
  for (const char* file : {"vocab.json", "merges.txt", "added_tokens.json"})
    fs::copy_file(dir.path() / file, legacy.path() / file);
  const ClipTokenizer from_legacy = ClipTokenizer::load(legacy.path());
  EXPECT_EQ(from_legacy.token_to_id("<other>"), 49409);
  EXPECT_EQ(from_legacy.encode_tokens("<other>"), (std::vector<int64_t>{49409}));
}

TEST(ClipTokenizer, BadFoldersAreOneLineErrorsNamingTheFile) {
  TempDir dir;
  const fs::path src = tokenizer_dir("tiny-sd1");
  std::string err = error_of([&] { ClipTokenizer::load(dir.path()); });
  EXPECT_NE(err.find((dir.path() / "vocab.json").string()), std::string::npos) << err;

  fs::copy_file(src / "vocab.json", dir.path() / "vocab.json");
  err = error_of([&] { ClipTokenizer::load(dir.path()); });
  EXPECT_NE(err.find((dir.path() / "merges.txt").string()), std::string::npos) << err;

  fs::copy_file(src / "merges.txt", dir.path() / "merges.txt");
  io::write_text_file(dir.path() / "tokenizer_config.json", "{\"model_max_length\": 77,");
  err = error_of([&] { ClipTokenizer::load(dir.path()); });
  EXPECT_NE(err.find((dir.path() / "tokenizer_config.json").string() + ": invalid JSON"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;

  io::write_text_file(dir.path() / "tokenizer_config.json", "{\"model_max_length\": \"77\"}");
  err = error_of([&] { ClipTokenizer::load(dir.path()); });
  EXPECT_NE(err.find("'model_max_length'"), std::string::npos) << err;

  fs::remove(dir.path() / "tokenizer_config.json");
  io::write_text_file(dir.path() / "vocab.json", "{\"a\": 0, \"b\": ");
  err = error_of([&] { ClipTokenizer::load(dir.path()); });
  EXPECT_NE(err.find((dir.path() / "vocab.json").string() + ": invalid JSON"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;

  io::write_text_file(dir.path() / "vocab.json", "{\"a\": \"zero\"}");
  err = error_of([&] { ClipTokenizer::load(dir.path()); });
  EXPECT_NE(err.find("key 'a'"), std::string::npos) << err;
}

TEST(ClipTokenizer, LongPromptEncodesWellUnderAMillisecond) {
  const ClipTokenizer tok = ClipTokenizer::load(tokenizer_dir("tiny-sd1"));
  const std::string prompt = cases()["cases"][27]["prompt"].get<std::string>();  // 96 tokens, truncated
  tok.encode(prompt);                                                            // fills the BPE cache
  const int n = 200;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) tok.encode(prompt);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / n;
  EXPECT_LT(ms, 1.0) << "ms per prompt";
  RecordProperty("ms_per_prompt", std::to_string(ms));
}

TEST(TextFixer, HtmlEntities) {
  EXPECT_EQ(fix_text("fish &amp; chips &lt;3"), "fish & chips <3");
  EXPECT_EQ(fix_text("P&eacute;rez P&EACUTE;REZ &nTILDE; &Ntilde;"), "Pérez PÉREZ &nTILDE; Ñ");
  EXPECT_EQ(fix_text("&#65;&#x42;&#X43; &#x1F600;"), "ABC 😀");
  EXPECT_EQ(fix_text("&#12ab; &bogus; &#;"), "&#12ab; &bogus; &#;");
  EXPECT_EQ(fix_text("&amp;amp;"), "&");                            // repeated until stable
  EXPECT_EQ(fix_text("it&rsquo;s &ldquo;x&rdquo;"), "it's \"x\"");  // decoded, then uncurled
  EXPECT_EQ(fix_text("&#150; &#0;"), "– \uFFFD");                   // Windows-1252 and NUL rules of html.unescape
  // A '<' marks the text as HTML: entities stay, from that line on.
  EXPECT_EQ(fix_text("&amp;\n<b> &amp;\n&amp;"), "&\n<b> &amp;\n&amp;");
}

TEST(TextFixer, CharacterFixes) {
  EXPECT_EQ(fix_text("ﬂuﬃeﬆ"), "fluffiest");
  EXPECT_EQ(fix_text("ＬＯＵＤ　ＮＯＩＳＥＳ ｶﾀｶﾅ"), "LOUD NOISES カタカナ");
  EXPECT_EQ(fix_text("a\r\nb\rc\u2028d\u0085e"), "a\nb\nc\nd…e");  // U+0085 is a C1 control: cp1252 first
  EXPECT_EQ(fix_text("\x1b[36;44mblue\x1b[0m\x01\ufeff"), "blue");
  EXPECT_EQ(fix_text("cafe\u0301 \u2018q\u2019 \u201cq\u201d"), "café 'q' \"q\"");
  EXPECT_EQ(fix_text("\u0080\u0093x"), "\u20ac\"x");  // C1 controls read as Windows-1252 (then uncurled)
  EXPECT_EQ(fix_text("a\xff\xc3"
                     "b"),
            "a\uFFFD\uFFFDb");  // invalid UTF-8 bytes become U+FFFD
}

}  // namespace
}  // namespace sd::text
