// Applying textual-inversion embeddings to a pipeline as diffusers 0.24's load_textual_inversion does (new tokens
// in the tokenizer, new rows in the text encoder's token embedding), and the prompt rewrite that lets one keyword
// stand for a multi-vector embedding.
#pragma once
#include <string>
#include <vector>

#include "models/clip/clip_text_model.h"
#include "pipeline/embedding_file.h"
#include "text/clip_tokenizer.h"

namespace sd::pipeline {

// Adds embedding.token (and token_1, token_2, ... for a multi-vector embedding) to `tokenizer`, resizes the text
// encoder's token embedding to len(tokenizer) + n rows and writes the vectors into the new tokens' rows (cast to
// the embedding's dtype). `source` names the file in errors. Throws sd::Error, changing nothing, when the vectors'
// width differs from the text encoder's hidden_size or when any of the tokens is already in the vocabulary.
// Returns the tokens added, in row order.
std::vector<std::string> load_textual_inversion(text::ClipTokenizer& tokenizer, models::ClipTextModel& text_encoder,
                                                const EmbeddingFile& embedding, const std::string& source);

// diffusers' maybe_convert_prompt: every added token t of the prompt that has companions t_1, t_2, ... in the
// tokenizer is replaced (everywhere, as Python's str.replace) by "t t_1 t_2 ...". Other prompts come back unchanged.
std::string maybe_convert_prompt(const std::string& prompt, const text::ClipTokenizer& tokenizer);

}  // namespace sd::pipeline
