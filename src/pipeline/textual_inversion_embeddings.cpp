#include "pipeline/textual_inversion_embeddings.h"

#include <torch/csrc/autograd/grad_mode.h>

#include <unordered_set>

#include "core/error.h"

namespace sd::pipeline {

std::vector<std::string> load_textual_inversion(text::ClipTokenizer& tokenizer, models::ClipTextModel& text_encoder,
                                                const EmbeddingFile& embedding, const std::string& source) {
  const at::Tensor& vectors = embedding.vectors;  // [n, dim]
  SD_CHECK(vectors.dim() == 2 && vectors.size(0) >= 1, "{}: embedding '{}' must be [num_vectors, dim], got {} dims",
           source, embedding.token, vectors.dim());
  const int64_t hidden = text_encoder->config().hidden_size;
  SD_CHECK(vectors.size(1) == hidden,
           "{}: embedding '{}' has width {} but the text encoder's hidden_size is {} (made for another model?)", source,
           embedding.token, vectors.size(1), hidden);
  const std::vector<std::string> tokens = embedding_tokens(embedding.token, vectors.size(0));
  // All checks before any change, so a rejected file leaves the pipeline as it was.
  for (const std::string& token : tokens) {
    SD_CHECK(!token.empty(), "{}: the embedding's token name is empty", source);
    SD_CHECK(!tokenizer.token_to_id(token), "{}: token '{}' is already in the tokenizer's vocabulary; rename it",
             source, token);
  }
  // diffusers also refuses a single-vector token whose "<token>_1" exists (it would be read as multi-vector).
  const std::string companion = embedding.token + "_1";
  SD_CHECK(tokens.size() > 1 || !tokenizer.token_to_id(companion),
           "{}: token '{}' is already in the tokenizer's vocabulary (so '{}' would be taken as multi-vector)", source,
           companion, embedding.token);

  text_encoder->resize_token_embeddings(static_cast<int64_t>(tokenizer.size() + tokens.size()));
  const at::Tensor& weight = text_encoder->token_embedding()->weight;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t id = tokenizer.add_token(tokens[i]);
    SD_CHECK(id < weight.size(0), "{}: token '{}' got id {} beyond the {} embedding rows", source, tokens[i], id,
             weight.size(0));
    weight[id].copy_(vectors[static_cast<int64_t>(i)]);
  }
  return tokens;
}

namespace {

// Python's str.replace(old, new): every non-overlapping occurrence, left to right.
std::string replace_all(const std::string& text, const std::string& old, const std::string& replacement) {
  if (old.empty()) return text;
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = text.find(old, pos)) != std::string::npos; pos = hit + old.size())
    out.append(text, pos, hit - pos).append(replacement);
  return out.append(text, pos, std::string::npos);
}

}  // namespace

std::string maybe_convert_prompt(const std::string& prompt, const text::ClipTokenizer& tokenizer) {
  std::unordered_set<std::string> added;
  for (const auto& [id, token] : tokenizer.added_tokens()) added.insert(token.content);
  if (added.empty()) return prompt;
  std::string converted = prompt;
  std::unordered_set<std::string> seen;
  for (const std::string& token : tokenizer.tokenize(prompt)) {
    if (!added.count(token) || !seen.insert(token).second) continue;
    std::string replacement = token;
    for (int i = 1; added.count(fmt::format("{}_{}", token, i)); ++i) replacement += fmt::format(" {}_{}", token, i);
    if (replacement != token) converted = replace_all(converted, token, replacement);
  }
  return converted;
}

}  // namespace sd::pipeline
