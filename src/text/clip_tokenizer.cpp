#include "text/clip_tokenizer.h"

#include <algorithm>
#include <array>
#include <limits>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json_config.h"
#include "text/text_fixer.h"
#include "text/unicode.h"

namespace sd::text {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// transformers reads merges.txt as `read().strip().split("\n")[1 : 49152 - 256 - 2 + 1]`: the first line is
// the "#version" header and at most 48894 merges are used, whatever the file holds.
constexpr size_t kMaxMerges = 49152 - 256 - 2;

json read_json_file(const fs::path& path) {
  SD_CHECK(fs::exists(path), "{}: missing file", path.string());
  const std::string text = io::read_text_file(path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON ({})", path.string(), e.what());
  }
}

std::string dump_like_python(const json& value) {
  // json.dumps(indent=2, sort_keys=True, ensure_ascii=False) + "\n": nlohmann objects are key-sorted and
  // dump(2) uses the same separators.
  return value.dump(2, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace) + "\n";
}

// GPT-2's byte -> printable-character map: printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order, so every byte string becomes a string without whitespace or control characters.
std::array<char32_t, 256> make_byte_map() {
  std::array<char32_t, 256> map{};
  std::array<bool, 256> direct{};
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) map[b] = direct[b] ? static_cast<char32_t>(b) : next++;
  return map;
}

// A special token's string from tokenizer_config.json / special_tokens_map.json: "x" or {"content": "x", ...}.
std::optional<std::string> token_string(const json& root, const std::string& key, const fs::path& file) {
  if (!root.is_object() || !root.contains(key) || root[key].is_null()) return std::nullopt;
  const json& v = root[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  fail("{}: key '{}' must be a string or an object with a string 'content', got {}", file.string(), key, v.dump());
}

bool json_flag(const json& obj, const char* key, bool fallback, const fs::path& file, const std::string& where) {
  if (!obj.contains(key) || obj[key].is_null()) return fallback;
  SD_CHECK(obj[key].is_boolean(), "{}: key '{}.{}' must be true or false, got {}", file.string(), where, key,
           obj[key].dump());
  return obj[key].get<bool>();
}

// Python's str.strip() on a UTF-8 string, for the whitespace transformers strips around added tokens.
std::string py_lstrip(const std::string& s) {
  const std::u32string u = utf8_to_u32(s);
  size_t i = 0;
  while (i < u.size() && py_isspace(u[i])) ++i;
  return u32_to_utf8(std::u32string_view(u).substr(i));
}
std::string py_rstrip(const std::string& s) {
  std::u32string u = utf8_to_u32(s);
  while (!u.empty() && py_isspace(u.back())) u.pop_back();
  return u32_to_utf8(u);
}

// The `regex` module's \s: Python's whitespace except the four information separators U+001C..U+001F.
bool regex_space(char32_t c) { return py_isspace(c) && !(c >= 0x1C && c <= 0x1F); }

// Case-insensitive literal match at text[i] (the CLIP pattern is compiled with IGNORECASE; `regex` compares
// simple case folds, so "'ſ" matches "'s").
bool matches_at(const std::u32string& text, size_t i, std::u32string_view literal) {
  if (i + literal.size() > text.size()) return false;
  for (size_t k = 0; k < literal.size(); ++k)
    if (simple_case_fold(text[i + k]) != literal[k]) return false;
  return true;
}

// re.findall of CLIP's pattern
//   <\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+
// Alternatives are tried in order at each position; none needs backtracking.
std::vector<std::u32string> clip_pretokenize(const std::u32string& text) {
  static constexpr std::u32string_view kLiterals[] = {
      U"<|startoftext|>", U"<|endoftext|>", U"'s", U"'t", U"'re", U"'ve", U"'m", U"'ll", U"'d"};
  std::vector<std::u32string> out;
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    size_t len = 0;
    for (std::u32string_view literal : kLiterals)
      if (matches_at(text, i, literal)) {
        len = literal.size();
        break;
      }
    if (len == 0) {
      const char32_t c = text[i];
      if (is_letter(c)) {
        size_t j = i;
        while (j < n && is_letter(text[j])) ++j;
        len = j - i;
      } else if (is_number(c)) {
        len = 1;
      } else if (!regex_space(c)) {
        size_t j = i;
        while (j < n && !regex_space(text[j]) && !is_letter(text[j]) && !is_number(text[j])) ++j;
        len = j - i;
      }
    }
    if (len == 0) {
      ++i;  // whitespace separates matches
      continue;
    }
    out.emplace_back(text.substr(i, len));
    i += len;
  }
  return out;
}

// CLIPTokenizer._tokenize's normalisation: whitespace_clean(ftfy.fix_text(text)).lower().
std::u32string normalize_piece(const std::string& piece) {
  const std::u32string fixed = fix_text(utf8_to_u32(piece));
  std::u32string cleaned;
  cleaned.reserve(fixed.size());
  bool in_space = false;
  for (char32_t c : fixed) {
    if (py_isspace(c)) {
      in_space = true;
      continue;
    }
    if (in_space && !cleaned.empty()) cleaned.push_back(U' ');
    in_space = false;
    cleaned.push_back(c);
  }
  return py_lower(cleaned);
}

}  // namespace

// The merge table, interned: every symbol (byte character, byte character + "</w>", merge parts and results)
// gets an integer id, and a pair of ids maps to (rank, merged id).
struct ClipTokenizer::BpeTables {
  std::vector<std::string> symbols;
  std::unordered_map<std::string, int32_t> symbol_ids;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (a << 32 | b) -> (rank, merged)
  std::vector<std::pair<std::string, std::string>> merges_by_rank;   // for save(); ranks are indices
  std::array<std::string, 256> byte_chars;                           // UTF-8 of the mapped character
  std::unordered_map<char32_t, uint8_t> byte_decoder;

  int32_t intern(const std::string& s) {
    auto [it, inserted] = symbol_ids.emplace(s, static_cast<int32_t>(symbols.size()));
    if (inserted) symbols.push_back(s);
    return it->second;
  }
  std::optional<int32_t> find(const std::string& s) const {
    auto it = symbol_ids.find(s);
    if (it == symbol_ids.end()) return std::nullopt;
    return it->second;
  }
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
};

ClipTokenizer::ClipTokenizer(ClipTokenizer&& other) noexcept { *this = std::move(other); }

ClipTokenizer& ClipTokenizer::operator=(ClipTokenizer&& other) noexcept {
  if (this == &other) return *this;
  vocab_ = std::move(other.vocab_);
  encoder_ = std::move(other.encoder_);
  bpe_ = std::move(other.bpe_);
  added_ = std::move(other.added_);
  added_encoder_ = std::move(other.added_encoder_);
  added_by_length_ = std::move(other.added_by_length_);
  bos_token_ = std::move(other.bos_token_);
  eos_token_ = std::move(other.eos_token_);
  unk_token_ = std::move(other.unk_token_);
  pad_token_ = std::move(other.pad_token_);
  bos_id_ = other.bos_id_, eos_id_ = other.eos_id_, unk_id_ = other.unk_id_, pad_id_ = other.pad_id_;
  model_max_length_ = other.model_max_length_;
  config_ = std::move(other.config_);
  special_tokens_map_ = std::move(other.special_tokens_map_);
  std::scoped_lock lock(cache_mutex_, other.cache_mutex_);
  cache_ = std::move(other.cache_);
  return *this;
}

ClipTokenizer::ClipTokenizer(const ClipTokenizer& other) { *this = other; }

ClipTokenizer& ClipTokenizer::operator=(const ClipTokenizer& other) {
  if (this == &other) return *this;
  vocab_ = other.vocab_;
  encoder_ = other.encoder_;
  bpe_ = other.bpe_;
  added_ = other.added_;
  added_encoder_ = other.added_encoder_;
  added_by_length_ = other.added_by_length_;
  bos_token_ = other.bos_token_, eos_token_ = other.eos_token_, unk_token_ = other.unk_token_;
  pad_token_ = other.pad_token_;
  bos_id_ = other.bos_id_, eos_id_ = other.eos_id_, unk_id_ = other.unk_id_, pad_id_ = other.pad_id_;
  model_max_length_ = other.model_max_length_;
  config_ = other.config_;
  special_tokens_map_ = other.special_tokens_map_;
  std::scoped_lock lock(cache_mutex_, other.cache_mutex_);
  cache_ = other.cache_;
  return *this;
}

ClipTokenizer::~ClipTokenizer() = default;

ClipTokenizer ClipTokenizer::load(const fs::path& dir) {
  ClipTokenizer tok;
  SD_CHECK(fs::is_directory(dir), "{}: tokenizer folder not found", dir.string());
  const fs::path vocab_file = dir / "vocab.json", merges_file = dir / "merges.txt";
  SD_CHECK(fs::exists(vocab_file), "{}: missing file (a CLIP tokenizer folder needs vocab.json and merges.txt)",
           vocab_file.string());
  SD_CHECK(fs::exists(merges_file), "{}: missing file (a CLIP tokenizer folder needs vocab.json and merges.txt)",
           merges_file.string());

  // vocab.json: {token: id}
  const json vocab = read_json_file(vocab_file);
  SD_CHECK(vocab.is_object() && !vocab.empty(), "{}: expected a non-empty JSON object of token -> id",
           vocab_file.string());
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab.items()) {
    SD_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, "{}: key '{}' must be a non-negative integer id, got {}",
             vocab_file.string(), token, id.dump());
    max_id = std::max(max_id, id.get<int64_t>());
  }
  // Ids index a table; a wildly sparse id space is a broken file, not a vocabulary.
  SD_CHECK(max_id < static_cast<int64_t>(vocab.size()) * 2 + 1024, "{}: token ids go up to {} for only {} tokens",
           vocab_file.string(), max_id, vocab.size());
  tok.vocab_.assign(static_cast<size_t>(max_id + 1), std::string());
  tok.encoder_.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    tok.encoder_[token] = id.get<int64_t>();
    tok.vocab_[static_cast<size_t>(id.get<int64_t>())] = token;
  }

  // merges.txt
  auto tables = std::make_shared<BpeTables>();
  const auto byte_map = make_byte_map();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, byte_map[b]);
    tables->byte_chars[b] = s;
    tables->byte_decoder[byte_map[b]] = static_cast<uint8_t>(b);
    tables->intern(s);
    tables->intern(s + "</w>");
  }
  {
    const std::string text = io::read_text_file(merges_file);
    size_t begin = 0, end = text.size();
    auto ascii_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
    while (begin < end && ascii_space(text[begin])) ++begin;
    while (end > begin && ascii_space(text[end - 1])) --end;
    std::vector<std::string_view> lines;
    for (size_t pos = begin; pos <= end && lines.size() <= kMaxMerges;) {
      size_t nl = text.find('\n', pos);
      if (nl == std::string::npos || nl > end) nl = end;
      lines.emplace_back(text.data() + pos, nl - pos);
      pos = nl + 1;
    }
    SD_CHECK(!lines.empty() && !(lines.size() == 1 && lines[0].empty()), "{}: no merges", merges_file.string());
    // dict(zip(merges, range(n))): a repeated pair keeps its last rank.
    std::vector<std::pair<std::string, std::string>> parsed;
    for (size_t i = 1; i < lines.size(); ++i) {
      std::vector<std::string> parts;
      std::string_view line = lines[i];
      size_t p = 0;
      while (p < line.size()) {
        while (p < line.size() && ascii_space(line[p])) ++p;
        size_t q = p;
        while (q < line.size() && !ascii_space(line[q])) ++q;
        if (q > p) parts.emplace_back(line.substr(p, q - p));
        p = q;
      }
      if (parts.size() == 2) {
        parsed.emplace_back(parts[0], parts[1]);
      } else {
        parsed.emplace_back();  // keeps the rank numbering; such a "pair" never matches (as in Python)
      }
    }
    for (size_t rank = 0; rank < parsed.size(); ++rank) {
      const auto& [a, b] = parsed[rank];
      if (a.empty()) continue;
      const int32_t ia = tables->intern(a), ib = tables->intern(b), merged = tables->intern(a + b);
      tables->merges[BpeTables::key(ia, ib)] = {static_cast<int32_t>(rank), merged};
    }
    std::vector<std::pair<int32_t, std::pair<std::string, std::string>>> ranked;
    for (const auto& [k, v] : tables->merges)
      ranked.push_back(
          {v.first,
           {tables->symbols[static_cast<size_t>(k >> 32)], tables->symbols[static_cast<size_t>(k & 0xFFFFFFFFu)]}});
    std::sort(ranked.begin(), ranked.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    for (auto& r : ranked) tables->merges_by_rank.push_back(std::move(r.second));
  }
  tok.bpe_ = tables;

  // tokenizer_config.json, special_tokens_map.json, added_tokens.json (all optional).
  const fs::path config_file = dir / "tokenizer_config.json", special_file = dir / "special_tokens_map.json",
                 added_file = dir / "added_tokens.json";
  if (fs::exists(config_file)) {
    tok.config_ = read_json_file(config_file);
    SD_CHECK(tok.config_.is_object(), "{}: expected a JSON object", config_file.string());
  }
  if (fs::exists(special_file)) {
    tok.special_tokens_map_ = read_json_file(special_file);
    SD_CHECK(tok.special_tokens_map_.is_object(), "{}: expected a JSON object", special_file.string());
  }
  auto special = [&](const std::string& key, const std::string& fallback) {
    if (auto s = token_string(tok.config_, key, config_file)) return *s;
    if (auto s = token_string(tok.special_tokens_map_, key, special_file)) return *s;
    return fallback;
  };
  tok.bos_token_ = special("bos_token", "<|startoftext|>");
  tok.eos_token_ = special("eos_token", "<|endoftext|>");
  tok.unk_token_ = special("unk_token", "<|endoftext|>");
  tok.pad_token_ = special("pad_token", "<|endoftext|>");
  if (tok.config_.contains("model_max_length") && !tok.config_["model_max_length"].is_null()) {
    const json& v = tok.config_["model_max_length"];
    SD_CHECK(v.is_number(), "{}: key 'model_max_length' must be a number, got {}", config_file.string(), v.dump());
    const double m = v.get<double>();
    SD_CHECK(m >= 2, "{}: key 'model_max_length' must be at least 2, got {}", config_file.string(), v.dump());
    // transformers' "no limit" placeholder (int(1e30)) means the CLIP default of 77 here; anything else pads every
    // prompt to its length, so it is held to what a text encoder can have.
    tok.model_max_length_ = m > 1e9 ? 77 : static_cast<int64_t>(m);
    io::check_at_most(config_file.string(), "model_max_length", tok.model_max_length_, 4096);
  }

  if (tok.config_.contains("added_tokens_decoder")) {
    const json& decoder = tok.config_["added_tokens_decoder"];
    SD_CHECK(decoder.is_object(), "{}: key 'added_tokens_decoder' must be an object of id -> token",
             config_file.string());
    for (const auto& [id_str, entry] : decoder.items()) {
      const std::string where = "added_tokens_decoder." + id_str;
      int64_t id = -1;
      try {
        size_t used = 0;
        id = std::stoll(id_str, &used);
        if (used != id_str.size()) id = -1;
      } catch (const std::exception&) {
      }
      SD_CHECK(id >= 0, "{}: key '{}' is not a token id", config_file.string(), where);
      AddedToken t;
      if (entry.is_string()) {
        t.content = entry.get<std::string>();
      } else {
        SD_CHECK(entry.is_object() && entry.contains("content") && entry["content"].is_string(),
                 "{}: key '{}' must be an object with a string 'content'", config_file.string(), where);
        t.content = entry["content"].get<std::string>();
        t.lstrip = json_flag(entry, "lstrip", false, config_file, where);
        t.rstrip = json_flag(entry, "rstrip", false, config_file, where);
        t.single_word = json_flag(entry, "single_word", false, config_file, where);
        t.normalized = json_flag(entry, "normalized", true, config_file, where);
        t.special = json_flag(entry, "special", false, config_file, where);
      }
      SD_CHECK(!t.content.empty(), "{}: key '{}' has an empty token", config_file.string(), where);
      tok.added_.emplace_back(id, std::move(t));
    }
    tok.rebuild_added_index();
  }
  if (fs::exists(added_file)) {
    // Legacy {token: id}; entries the config already describes win.
    const json legacy = read_json_file(added_file);
    SD_CHECK(legacy.is_object(), "{}: expected a JSON object of token -> id", added_file.string());
    for (const auto& [content, id] : legacy.items()) {
      SD_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, "{}: key '{}' must be a non-negative integer id",
               added_file.string(), content);
      const int64_t wanted = id.get<int64_t>();  // a copy: C++17 lambdas cannot capture structured bindings
      const bool id_taken =
          std::any_of(tok.added_.begin(), tok.added_.end(), [&](const auto& p) { return p.first == wanted; });
      if (tok.added_encoder_.count(content) || id_taken || content.empty()) continue;
      AddedToken t;
      t.content = content;
      tok.added_.emplace_back(id.get<int64_t>(), std::move(t));
      tok.rebuild_added_index();
    }
  }
  // As PreTrainedTokenizer.__init__: special tokens that are not added tokens yet become special added tokens
  // (at their vocabulary id when they have one) -- this is how SD-2's pad token "!" ends up matched verbatim.
  for (const std::string& s : {tok.bos_token_, tok.eos_token_, tok.unk_token_, tok.pad_token_})
    tok.add_special_if_missing(s);

  tok.bos_id_ = tok.convert_token(tok.bos_token_);
  tok.eos_id_ = tok.convert_token(tok.eos_token_);
  tok.unk_id_ = tok.convert_token(tok.unk_token_);
  tok.pad_id_ = tok.convert_token(tok.pad_token_);
  // CLIPTokenizer.bpe's cache starts with the two markers, so they pass through BPE unchanged.
  tok.cache_["<|startoftext|>"] = {"<|startoftext|>"};
  tok.cache_["<|endoftext|>"] = {"<|endoftext|>"};
  return tok;
}

void ClipTokenizer::rebuild_added_index() {
  std::stable_sort(added_.begin(), added_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  added_encoder_.clear();
  for (const auto& [id, t] : added_) added_encoder_[t.content] = id;
  added_by_length_.clear();
  for (const auto& [content, id] : added_encoder_) added_by_length_.push_back(content);
  std::sort(added_by_length_.begin(), added_by_length_.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() > b.size() : a < b;
  });
}

void ClipTokenizer::add_special_if_missing(const std::string& content) {
  if (content.empty() || added_encoder_.count(content)) return;
  AddedToken t;
  t.content = content;
  t.special = true;
  t.normalized = false;
  auto it = encoder_.find(content);
  const int64_t id = it != encoder_.end() ? it->second : static_cast<int64_t>(size());
  added_.emplace_back(id, std::move(t));
  rebuild_added_index();
}

int64_t ClipTokenizer::max_token_id() const {
  int64_t max_id = -1;
  for (const auto& [token, id] : encoder_) max_id = std::max<int64_t>(max_id, id);
  for (const auto& [id, token] : added_) max_id = std::max(max_id, id);
  return max_id;
}

size_t ClipTokenizer::size() const {
  size_t n = encoder_.size();
  for (const auto& [content, id] : added_encoder_)
    if (!encoder_.count(content)) ++n;
  return n;
}

int64_t ClipTokenizer::add_token(const std::string& token) {
  SD_CHECK(!token.empty(), "cannot add an empty token to the tokenizer");
  SD_CHECK(!added_encoder_.count(token) && !encoder_.count(token),
           "token '{}' is already in the tokenizer's vocabulary", token);
  AddedToken t;
  t.content = token;
  const int64_t id = static_cast<int64_t>(size());
  added_.emplace_back(id, std::move(t));
  rebuild_added_index();
  return id;
}

std::optional<int64_t> ClipTokenizer::token_to_id(const std::string& token) const {
  if (auto it = added_encoder_.find(token); it != added_encoder_.end()) return it->second;
  if (auto it = encoder_.find(token); it != encoder_.end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> ClipTokenizer::id_to_token(int64_t id) const {
  for (const auto& [aid, t] : added_)
    if (aid == id) return t.content;
  if (id >= 0 && id < static_cast<int64_t>(vocab_.size()) && !vocab_[static_cast<size_t>(id)].empty())
    return vocab_[static_cast<size_t>(id)];
  return std::nullopt;
}

int64_t ClipTokenizer::convert_token(const std::string& token) const {
  if (auto it = added_encoder_.find(token); it != added_encoder_.end()) return it->second;
  if (auto it = encoder_.find(token); it != encoder_.end()) return it->second;
  if (auto it = added_encoder_.find(unk_token_); it != added_encoder_.end()) return it->second;
  if (auto it = encoder_.find(unk_token_); it != encoder_.end()) return it->second;
  fail("token '{}' is not in the vocabulary and the unknown token '{}' is not either", token, unk_token_);
}

std::vector<std::string> ClipTokenizer::bpe(const std::string& word) const {
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (auto it = cache_.find(word); it != cache_.end()) return it->second;
  }
  const BpeTables& t = *bpe_;
  // Split the byte-level word into characters (1-2 UTF-8 bytes each); the last one carries "</w>".
  std::vector<std::string> chars;
  for (size_t i = 0; i < word.size();) {
    size_t len = 1;
    while (i + len < word.size() && (static_cast<unsigned char>(word[i + len]) & 0xC0) == 0x80) ++len;
    chars.emplace_back(word.substr(i, len));
    i += len;
  }
  if (chars.empty()) return {};
  if (chars.size() == 1) return {word + "</w>"};  // CLIPTokenizer returns early here, without caching
  chars.back() += "</w>";
  std::vector<int32_t> syms;
  std::vector<std::string> unknown;  // symbols the merge table has never seen (cannot merge)
  for (const auto& c : chars) {
    if (auto id = t.find(c)) {
      syms.push_back(*id);
    } else {
      syms.push_back(-1 - static_cast<int32_t>(unknown.size()));
      unknown.push_back(c);
    }
  }
  // Merge the lowest-ranked adjacent pair everywhere (left to right), until no pair has a rank.
  std::vector<int32_t> next;
  while (syms.size() > 1) {
    int32_t best_rank = std::numeric_limits<int32_t>::max(), first = 0, second = 0, merged = 0;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      if (syms[i] < 0 || syms[i + 1] < 0) continue;
      auto it = t.merges.find(BpeTables::key(syms[i], syms[i + 1]));
      if (it != t.merges.end() && it->second.first < best_rank) {
        best_rank = it->second.first;
        first = syms[i], second = syms[i + 1], merged = it->second.second;
      }
    }
    if (best_rank == std::numeric_limits<int32_t>::max()) break;
    next.clear();
    for (size_t i = 0; i < syms.size();) {
      if (syms[i] == first && i + 1 < syms.size() && syms[i + 1] == second) {
        next.push_back(merged);
        i += 2;
      } else {
        next.push_back(syms[i++]);
      }
    }
    syms.swap(next);
  }
  std::vector<std::string> pieces;
  pieces.reserve(syms.size());
  for (int32_t s : syms)
    pieces.push_back(s >= 0 ? t.symbols[static_cast<size_t>(s)] : unknown[static_cast<size_t>(-1 - s)]);
  std::lock_guard<std::mutex> lock(cache_mutex_);
  cache_.emplace(word, pieces);
  return pieces;
}

std::vector<std::pair<std::string, int64_t>> ClipTokenizer::split_on_added_tokens(const std::string& text) const {
  // Trie.split: leftmost, then longest, exact (case-sensitive) matches of added tokens, at character starts.
  std::vector<std::string> pieces;
  size_t start = 0, i = 0;
  while (i < text.size()) {
    const std::string* found = nullptr;
    for (const std::string& a : added_by_length_)
      if (text.compare(i, a.size(), a) == 0) {
        found = &a;
        break;
      }
    if (found) {
      if (i > start) pieces.push_back(text.substr(start, i - start));
      pieces.push_back(*found);
      i += found->size();
      start = i;
      continue;
    }
    ++i;
    while (i < text.size() && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) ++i;
  }
  if (start < text.size()) pieces.push_back(text.substr(start));

  // PreTrainedTokenizer.tokenize's handling of lstrip / rstrip / single_word around each added token.
  for (size_t k = 0; k < pieces.size(); ++k) {
    auto it = added_encoder_.find(pieces[k]);
    if (it == added_encoder_.end()) continue;
    const AddedToken* tok = nullptr;
    for (const auto& [id, t] : added_)
      if (id == it->second) tok = &t;
    if (!tok) continue;
    // As in Python, the neighbours are captured before stripping and the single_word tests look at them.
    const std::string left = k > 0 ? pieces[k - 1] : std::string();
    const std::string right = k + 1 < pieces.size() ? pieces[k + 1] : std::string();
    if (tok->rstrip && !right.empty()) pieces[k + 1] = py_lstrip(right);
    if (tok->lstrip && !left.empty()) pieces[k - 1] = py_rstrip(left);
    if (tok->single_word && !left.empty() && left.back() != ' ') {
      pieces[k - 1] += pieces[k];
      pieces[k].clear();
    } else if (tok->single_word && !right.empty() && right.front() != ' ') {
      pieces[k] += right;
      pieces[k + 1].clear();
    }
  }
  std::vector<std::pair<std::string, int64_t>> out;
  for (auto& p : pieces) {
    if (p.empty()) continue;
    auto it = added_encoder_.find(p);
    const int64_t id = it == added_encoder_.end() ? -1 : it->second;
    out.emplace_back(std::move(p), id);
  }
  return out;
}

void ClipTokenizer::tokenize_piece(const std::string& piece, std::vector<std::string>& out) const {
  const std::u32string text = normalize_piece(piece);
  const BpeTables& t = *bpe_;
  for (const std::u32string& match : clip_pretokenize(text)) {
    std::string word;
    for (unsigned char b : u32_to_utf8(match)) word += t.byte_chars[b];
    for (auto& p : bpe(word)) out.push_back(std::move(p));
  }
}

std::vector<std::string> ClipTokenizer::tokenize(const std::string& text) const {
  std::vector<std::string> out;
  for (const auto& [piece, id] : split_on_added_tokens(text)) {
    if (id >= 0) {
      out.push_back(piece);
    } else {
      tokenize_piece(piece, out);
    }
  }
  return out;
}

std::vector<int64_t> ClipTokenizer::encode_tokens(const std::string& text) const {
  std::vector<int64_t> ids;
  for (const std::string& token : tokenize(text)) ids.push_back(convert_token(token));
  return ids;
}

ClipEncoding ClipTokenizer::encode_full(const std::string& text, std::optional<int64_t> max_length) const {
  const int64_t max_len = max_length.value_or(model_max_length_);
  SD_CHECK(max_len >= 2, "max_length must be at least 2 (room for bos and eos), got {}", max_len);
  std::vector<int64_t> tokens = encode_tokens(text);
  ClipEncoding enc;
  enc.n_tokens_before_truncation = static_cast<int64_t>(tokens.size()) + 2;
  enc.truncated = enc.n_tokens_before_truncation > max_len;
  if (enc.truncated) tokens.resize(static_cast<size_t>(max_len - 2));
  enc.input_ids.reserve(static_cast<size_t>(max_len));
  enc.input_ids.push_back(bos_id_);
  enc.input_ids.insert(enc.input_ids.end(), tokens.begin(), tokens.end());
  enc.input_ids.push_back(eos_id_);
  enc.attention_mask.assign(enc.input_ids.size(), 1);
  enc.input_ids.resize(static_cast<size_t>(max_len), pad_id_);
  enc.attention_mask.resize(static_cast<size_t>(max_len), 0);
  return enc;
}

std::vector<int64_t> ClipTokenizer::encode(const std::string& text) const { return encode_full(text).input_ids; }

std::string ClipTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  // convert_tokens_to_string per run of BPE tokens; added tokens verbatim, runs joined by spaces.
  std::vector<std::string> parts;
  std::string bytes;
  auto flush = [&]() {
    if (bytes.empty()) return;
    std::u32string text = utf8_to_u32(bytes);
    std::string s = u32_to_utf8(text);
    for (size_t p; (p = s.find("</w>")) != std::string::npos;) s.replace(p, 4, " ");
    s = py_rstrip(py_lstrip(s));
    if (!s.empty()) parts.push_back(s);
    bytes.clear();
  };
  for (int64_t id : ids) {
    const AddedToken* added = nullptr;
    for (const auto& [aid, t] : added_)
      if (aid == id) added = &t;
    if (added) {
      if (skip_special_tokens && added->special) continue;
      flush();
      parts.push_back(added->content);
      continue;
    }
    auto token = id_to_token(id);
    if (!token) continue;
    for (char32_t c : utf8_to_u32(*token)) {
      auto it = bpe_->byte_decoder.find(c);
      if (it != bpe_->byte_decoder.end()) {
        bytes.push_back(static_cast<char>(it->second));
      } else {
        append_utf8(bytes, c);  // "</w>" and anything outside the byte alphabet
      }
    }
  }
  flush();
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? " " : "") + parts[i];
  return out;
}

void ClipTokenizer::save(const fs::path& dir) const {
  std::error_code ec;
  fs::create_directories(dir, ec);
  SD_CHECK(!ec, "{}: cannot create folder ({})", dir.string(), ec.message());

  json vocab = json::object();
  for (const auto& [token, id] : encoder_) vocab[token] = id;
  io::write_text_file(dir / "vocab.json", dump_like_python(vocab));

  std::string merges = "#version: 0.2\n";
  for (const auto& [a, b] : bpe_->merges_by_rank) merges += a + " " + b + "\n";
  io::write_text_file(dir / "merges.txt", merges);

  // tokenizer_config.json as PreTrainedTokenizerBase.save_pretrained (4.35) writes it: the init kwargs it was
  // loaded with, special tokens as strings, every added token under added_tokens_decoder.
  json config = config_.is_object() ? config_ : json::object();
  for (const char* key : {"name_or_path", "special_tokens_map_file", "tokenizer_file", "vocab_file", "merges_file"})
    config.erase(key);
  if (!config.contains("clean_up_tokenization_spaces")) config["clean_up_tokenization_spaces"] = true;
  if (!config.contains("errors")) config["errors"] = "replace";
  config["bos_token"] = bos_token_;
  config["eos_token"] = eos_token_;
  config["unk_token"] = unk_token_;
  config["pad_token"] = pad_token_;
  config["model_max_length"] = model_max_length_;
  config["tokenizer_class"] = "CLIPTokenizer";
  json decoder = json::object();
  for (const auto& [id, t] : added_) {
    decoder[std::to_string(id)] = {{"content", t.content}, {"lstrip", t.lstrip},           {"normalized", t.normalized},
                                   {"rstrip", t.rstrip},   {"single_word", t.single_word}, {"special", t.special}};
  }
  config["added_tokens_decoder"] = decoder;
  io::write_text_file(dir / "tokenizer_config.json", dump_like_python(config));

  json special = special_tokens_map_;
  if (!special.is_object() || special.empty()) {
    auto token_json = [&](const std::string& content) {
      return json{
          {"content", content}, {"lstrip", false}, {"normalized", true}, {"rstrip", false}, {"single_word", false}};
    };
    special = json{{"bos_token", token_json(bos_token_)},
                   {"eos_token", token_json(eos_token_)},
                   {"pad_token", pad_token_},
                   {"unk_token", token_json(unk_token_)}};
  }
  io::write_text_file(dir / "special_tokens_map.json", dump_like_python(special));

  // added_tokens.json: the added tokens beyond the base vocabulary (what older transformers read).
  json added = json::object();
  for (const auto& [id, t] : added_)
    if (id >= static_cast<int64_t>(encoder_.size())) added[t.content] = id;
  const fs::path added_file = dir / "added_tokens.json";
  if (!added.empty()) {
    io::write_text_file(added_file, dump_like_python(added));
  } else {
    fs::remove(added_file, ec);  // a stale file would re-add tokens on load
  }
}

}  // namespace sd::text
