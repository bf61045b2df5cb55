#include "pipeline/embedding_file.h"

#include <memory>

#include "core/error.h"
#include "io/tensor_file.h"

namespace sd::pipeline {

namespace fs = std::filesystem;

namespace {

at::Tensor as_vectors(at::Tensor t, const fs::path& path) {
  SD_CHECK(t.is_floating_point(), "{}: the embedding is {}, expected a floating-point tensor", path.string(),
           c10::toString(t.scalar_type()));
  if (t.dim() == 1) t = t.unsqueeze(0);
  SD_CHECK(t.dim() == 2 && t.size(0) > 0 && t.size(1) > 0,
           "{}: expected an embedding of shape [num_vectors, dim] or [dim], got [{}]", path.string(),
           fmt::join(t.sizes(), ", "));
  io::check_finite(t, path.string(), "embedding");
  return t.to(at::kFloat).contiguous();
}

// The file as named tensors, however stored. A reader's message starts with the path; the line says it once.
std::unique_ptr<io::TensorFile> open_tensors(const fs::path& path) {
  try {
    return io::open_tensor_file(path);
  } catch (const Error& e) {
    std::string reason = e.what();
    if (reason.rfind(path.string() + ": ", 0) == 0) reason.erase(0, path.string().size() + 2);
    fail("{}: cannot read as safetensors or torch.save file ({})", path.string(), reason);
  }
}

}  // namespace

// diffusers' {token: [n, dim]}, or A1111's emb_params (safetensors) / {"string_to_param": {"*": t}, "name": ...}
// (a torch.save file, read by the restricted unpickler, which names that tensor "string_to_param.*").
EmbeddingFile load_embedding_file(const fs::path& path) {
  SD_CHECK(fs::is_regular_file(path), "{}: embedding file not found", path.string());
  const std::unique_ptr<io::TensorFile> file = open_tensors(path);
  const auto name = file->metadata().find("name");
  const std::string a1111_name = name != file->metadata().end() ? name->second : path.stem().string();
  for (const char* a1111 : {"emb_params", "string_to_param.*"})
    if (file->contains(a1111)) return {a1111_name, as_vectors(file->read(a1111), path)};
  SD_CHECK(file->names().size() == 1,
           "{}: not an embedding file: expected one tensor {{token: [n, dim]}} (diffusers) or 'emb_params' / "
           "string_to_param (AUTOMATIC1111), found {} tensors",
           path.string(), file->names().size());
  const std::string& token = file->names().front();
  return {token, as_vectors(file->read(token), path)};
}

std::vector<std::string> embedding_tokens(const std::string& token, int64_t num_vectors) {
  std::vector<std::string> tokens{token};
  for (int64_t i = 1; i < num_vectors; ++i) tokens.push_back(fmt::format("{}_{}", token, i));
  return tokens;
}

}  // namespace sd::pipeline
