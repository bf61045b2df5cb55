// Textual-inversion embedding files: diffusers' `learned_embeds.safetensors` ({token: [n, dim]}), and the AUTOMATIC1111
// formats — safetensors with `emb_params` (or a flattened `string_to_param.*`), and torch.save pickles with
// `string_to_param` / diffusers' `learned_embeds.bin`.
#pragma once
#include <ATen/ATen.h>

#include <filesystem>
#include <string>
#include <vector>

namespace sd::pipeline {

struct EmbeddingFile {
  std::string token;   // the prompt keyword; A1111 files without a name use the file's stem
  at::Tensor vectors;  // [num_vectors, dim], float32
};

// Throws sd::Error naming the file when it is missing, corrupt, or in none of the known layouts.
EmbeddingFile load_embedding_file(const std::filesystem::path& path);

// The tokens a multi-vector embedding occupies, as diffusers names them: token, token_1, token_2, ...
std::vector<std::string> embedding_tokens(const std::string& token, int64_t num_vectors);

}  // namespace sd::pipeline
