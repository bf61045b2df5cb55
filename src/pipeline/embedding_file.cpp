#include "pipeline/embedding_file.h"

#include <torch/serialize.h>

#include <fstream>
#include <iterator>

#include "core/error.h"
#include "io/safetensors.h"

namespace sd::pipeline {

namespace fs = std::filesystem;

namespace {

at::Tensor as_vectors(at::Tensor t, const fs::path& path) {
  if (t.dim() == 1) t = t.unsqueeze(0);
  SD_CHECK(t.dim() == 2 && t.is_floating_point(),
           "{}: expected an embedding of shape [num_vectors, dim] or [dim], got {}", path.string(),
           fmt::format("{}", fmt::join(t.sizes(), "x")));
  return t.to(at::kFloat).contiguous();
}

EmbeddingFile from_safetensors(const fs::path& path) {
  io::TensorMap tensors = io::load_safetensors(path);
  if (tensors.count("emb_params")) return {path.stem().string(), as_vectors(tensors.at("emb_params"), path)};
  if (tensors.count("string_to_param.*"))
    return {path.stem().string(), as_vectors(tensors.at("string_to_param.*"), path)};
  SD_CHECK(tensors.size() == 1,
           "{}: not an embedding file: expected one tensor {{token: [n, dim]}} (diffusers) or 'emb_params' "
           "(AUTOMATIC1111), found {} tensors",
           path.string(), tensors.size());
  return {tensors.begin()->first, as_vectors(tensors.begin()->second, path)};
}

// torch.save files: a dict {token: tensor} (diffusers' .bin) or A1111's {"string_to_param": {"*": tensor}, "name":
// ...}.
EmbeddingFile from_pickle(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue root;
  try {
    root = torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    fail("{}: cannot read as safetensors or torch.save file", path.string());
  }
  SD_CHECK(root.isGenericDict(), "{}: expected a dict of embeddings", path.string());
  auto dict = root.toGenericDict();
  if (dict.contains("string_to_param")) {
    auto params = dict.at("string_to_param");
    SD_CHECK(params.isGenericDict() && params.toGenericDict().contains("*"), "{}: string_to_param has no '*' entry",
             path.string());
    std::string name = path.stem().string();
    if (dict.contains("name") && dict.at("name").isString()) name = dict.at("name").toStringRef();
    return {name, as_vectors(params.toGenericDict().at("*").toTensor(), path)};
  }
  SD_CHECK(dict.size() == 1, "{}: expected one {{token: tensor}} entry or string_to_param, found {} entries",
           path.string(), dict.size());
  const c10::IValue key = dict.begin()->key();
  const c10::IValue value = dict.begin()->value();
  SD_CHECK(key.isString() && value.isTensor(), "{}: expected {{token: tensor}}", path.string());
  return {key.toStringRef(), as_vectors(value.toTensor(), path)};
}

}  // namespace

EmbeddingFile load_embedding_file(const fs::path& path) {
  SD_CHECK(fs::is_regular_file(path), "{}: embedding file not found", path.string());
  std::ifstream in(path, std::ios::binary);
  char magic[2] = {0, 0};
  in.read(magic, 2);
  // torch.save writes a zip archive ("PK"); everything else is taken as safetensors.
  if (magic[0] == 'P' && magic[1] == 'K') return from_pickle(path);
  return from_safetensors(path);
}

std::vector<std::string> embedding_tokens(const std::string& token, int64_t num_vectors) {
  std::vector<std::string> tokens{token};
  for (int64_t i = 1; i < num_vectors; ++i) tokens.push_back(fmt::format("{}_{}", token, i));
  return tokens;
}

}  // namespace sd::pipeline
