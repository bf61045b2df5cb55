// CLIP's byte-level BPE tokenizer, reproducing transformers 4.35's (slow) CLIPTokenizer with ftfy installed:
// loads and saves a diffusers `tokenizer/` folder and supports tokens added at run time (textual inversion).
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace sd::text {

// transformers' AddedToken: a string matched verbatim (case-sensitive) before any normalisation.
struct AddedToken {
  std::string content;
  bool lstrip = false;       // eats whitespace on its left
  bool rstrip = false;       // eats whitespace on its right
  bool single_word = false;  // only matches as a whole word
  bool normalized = true;
  bool special = false;
};

// One prompt as the pipelines feed it to the text encoder.
struct ClipEncoding {
  std::vector<int64_t> input_ids;          // [bos] + tokens[:max-2] + [eos], padded to max_length
  std::vector<int64_t> attention_mask;     // 1 for bos/tokens/eos, 0 for padding
  int64_t n_tokens_before_truncation = 0;  // including bos and eos
  bool truncated = false;
};

class ClipTokenizer {
 public:
  // Reads vocab.json and merges.txt (required), tokenizer_config.json, special_tokens_map.json and
  // added_tokens.json (optional) from a diffusers `tokenizer/` folder.
  static ClipTokenizer load(const std::filesystem::path& tokenizer_dir);

  ClipTokenizer(ClipTokenizer&& other) noexcept;
  ClipTokenizer& operator=(ClipTokenizer&& other) noexcept;
  ClipTokenizer(const ClipTokenizer& other);
  ClipTokenizer& operator=(const ClipTokenizer& other);
  ~ClipTokenizer();

  // `tokenizer(text, padding="max_length", max_length=model_max_length, truncation=True).input_ids`.
  std::vector<int64_t> encode(const std::string& text) const;
  // The same with the attention mask and truncation facts; max_length defaults to model_max_length().
  ClipEncoding encode_full(const std::string& text, std::optional<int64_t> max_length = std::nullopt) const;
  // Token ids without bos/eos, padding or truncation.
  std::vector<int64_t> encode_tokens(const std::string& text) const;
  // BPE token strings (byte-level alphabet, "</w>" ends a word), without bos/eos: `tokenizer.tokenize(text)`.
  std::vector<std::string> tokenize(const std::string& text) const;
  // Text of ids (added tokens verbatim; "</w>" becomes a space). Unknown ids are skipped.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = true) const;

  // Adds a token matched verbatim before BPE (`tokenizer.add_tokens([token])`) and returns its id, the
  // next free id. Throws sd::Error if the token is empty or already known (vocabulary or added token).
  int64_t add_token(const std::string& token);

  std::optional<int64_t> token_to_id(const std::string& token) const;
  std::optional<std::string> id_to_token(int64_t id) const;
  // len(tokenizer): distinct strings of the vocabulary and the added tokens.
  size_t size() const;
  size_t vocab_size() const { return vocab_.size(); }
  // The largest id any token has (vocabulary or added): what the text encoder's embedding must cover.
  int64_t max_token_id() const;
  int64_t model_max_length() const { return model_max_length_; }
  int64_t bos_token_id() const { return bos_id_; }
  int64_t eos_token_id() const { return eos_id_; }
  int64_t pad_token_id() const { return pad_id_; }
  int64_t unk_token_id() const { return unk_id_; }
  // Added tokens by id (from tokenizer_config.json's added_tokens_decoder, special tokens, run-time additions).
  const std::vector<std::pair<int64_t, AddedToken>>& added_tokens() const { return added_; }

  // Writes vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json and (when tokens beyond the
  // vocabulary were added) added_tokens.json as transformers 4.35 writes them; each file atomically.
  void save(const std::filesystem::path& dir) const;

 private:
  ClipTokenizer() = default;
  struct BpeTables;

  std::vector<std::string> bpe(const std::string& word) const;
  // Splits on added tokens; pieces that are added tokens come back with their id, others with -1.
  std::vector<std::pair<std::string, int64_t>> split_on_added_tokens(const std::string& text) const;
  void tokenize_piece(const std::string& piece, std::vector<std::string>& out) const;
  int64_t convert_token(const std::string& token) const;
  void add_special_if_missing(const std::string& content);
  void rebuild_added_index();

  std::vector<std::string> vocab_;                     // id -> token (base vocabulary)
  std::unordered_map<std::string, int64_t> encoder_;   // token -> id (base vocabulary)
  std::shared_ptr<const BpeTables> bpe_;               // merges; shared by copies (immutable)
  std::vector<std::pair<int64_t, AddedToken>> added_;  // sorted by id
  std::unordered_map<std::string, int64_t> added_encoder_;
  std::vector<std::string> added_by_length_;  // added contents, longest first (for matching)

  std::string bos_token_ = "<|startoftext|>", eos_token_ = "<|endoftext|>", unk_token_ = "<|endoftext|>",
              pad_token_ = "<|endoftext|>";
  int64_t bos_id_ = 0, eos_id_ = 0, unk_id_ = 0, pad_id_ = 0;
  int64_t model_max_length_ = 77;
  nlohmann::json config_ = nlohmann::json::object();              // tokenizer_config.json as loaded
  nlohmann::json special_tokens_map_ = nlohmann::json::object();  // special_tokens_map.json as loaded

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<std::string>> cache_;  // byte-encoded word -> BPE pieces
};

}  // namespace sd::text
