// Helpers shared by the model tests: golden comparison with the measured ratio printed, error capture, copies of
// fixture model folders with edited weights, and which autograd nodes a model's output came through.
#pragma once
#include <torch/csrc/autograd/function.h>
#include <torch/nn/module.h>

#include <filesystem>
#include <functional>
#include <iostream>
#include <set>
#include <string>

#include "core/error.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace sd::test {

// max|a - e| / max|e| (the fixtures README's ratio).
inline double error_ratio(const at::Tensor& actual, const at::Tensor& expected) {
  auto a = actual.detach().to(at::kDouble);
  auto e = expected.detach().to(at::kDouble);
  return (a - e).abs().max().item<double>() / e.abs().max().item<double>();
}

// close_rel_max plus a log line, so a run shows how much margin each comparison has.
inline ::testing::AssertionResult matches_golden(const std::string& what, const at::Tensor& actual,
                                                 const at::Tensor& expected, double tol) {
  auto result = close_rel_max(actual, expected, tol);
  if (actual.sizes() == expected.sizes())
    std::cout << "  [ratio] " << what << " " << error_ratio(actual, expected) << " (tol " << tol << ")\n";
  return result << " (" << what << ")";
}

// ||a - e||₂ / ||e||₂
inline double rel_l2(const at::Tensor& actual, const at::Tensor& expected) {
  auto a = actual.detach().to(at::kDouble);
  auto e = expected.detach().to(at::kDouble);
  return ((a - e).norm() / e.norm()).item<double>();
}

// The message of the sd::Error `fn` throws, or "" if it throws none.
inline std::string error_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const sd::Error& e) {
    return e.what();
  }
  return "";
}

// Copies fixtures()/<pipeline>/<component>/config.json into `dir` and writes the component's weights, passed
// through `edit`, as diffusion_pytorch_model.safetensors there.
inline void write_edited_component(const std::filesystem::path& dir, const std::string& pipeline,
                                   const std::string& component, const std::function<void(io::TensorMap&)>& edit) {
  const auto src = fixtures() / pipeline / component;
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(src / "config.json", dir / "config.json",
                             std::filesystem::copy_options::overwrite_existing);
  io::TensorMap weights = io::load_safetensors(src / "diffusion_pytorch_model.safetensors");
  edit(weights);
  io::save_safetensors(dir / "diffusion_pytorch_model.safetensors", weights);
}

// Whether `name` is a node of the autograd graph that produced `out`.
inline bool graph_has_node(const at::Tensor& out, const std::string& name) {
  std::vector<std::shared_ptr<torch::autograd::Node>> pending{out.grad_fn()};
  std::set<const torch::autograd::Node*> seen;
  while (!pending.empty()) {
    const std::shared_ptr<torch::autograd::Node> node = pending.back();
    pending.pop_back();
    if (!node || !seen.insert(node.get()).second) continue;
    if (node->name().find(name) != std::string::npos) return true;
    for (const auto& edge : node->next_edges()) pending.push_back(edge.function);
  }
  return false;
}

}  // namespace sd::test
