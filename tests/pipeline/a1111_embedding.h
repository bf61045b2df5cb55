// An A1111 textual-inversion embedding as torch.save writes it, for the embedding tests and the fuzzers' seeds.
#pragma once
#include <torch/serialize.h>

#include <string>
#include <vector>

namespace sd::test {

// {"string_to_token": {"*": 265}, "string_to_param": {"*": vectors}, "name": name, "step": 500}: the file's bytes.
inline std::vector<char> a1111_embedding_bytes(const at::Tensor& vectors, const std::string& name) {
  c10::impl::GenericDict token(c10::StringType::get(), c10::IntType::get());
  token.insert("*", int64_t{265});
  c10::impl::GenericDict param(c10::StringType::get(), c10::TensorType::get());
  param.insert("*", vectors);
  c10::impl::GenericDict root(c10::StringType::get(), c10::AnyType::get());
  root.insert("string_to_token", token);
  root.insert("string_to_param", param);
  root.insert("name", name);
  root.insert("step", int64_t{500});
  return torch::pickle_save(root);
}

}  // namespace sd::test
