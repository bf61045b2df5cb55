// Helpers shared by the attention kernels' tests: an attention's output and input gradients under a fixed weighting
// of the output, and their comparison.
#pragma once
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "model_test_util.h"

namespace sd::test {

struct AttentionGrads {
  at::Tensor out, dq, dk, dv;
};

// attention(q, k, v) and the gradients of sum(attention(q, k, v) * weight) in q, k and v.
template <typename Fn>
AttentionGrads attention_grads(const Fn& attention, const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0,
                               const at::Tensor& weight) {
  at::Tensor q = q0.detach().requires_grad_(), k = k0.detach().requires_grad_(), v = v0.detach().requires_grad_();
  at::Tensor out = attention(q, k, v);
  (out * weight).sum().backward();
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

// The gradients of loss(q, k, v) in q, k and v by central differences on every element, step h.
template <typename Loss>
AttentionGrads numeric_attention_grads(const Loss& loss, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       double h) {
  AttentionGrads numeric;
  at::Tensor* grads[] = {&numeric.dq, &numeric.dk, &numeric.dv};
  for (int w = 0; w < 3; ++w) {
    at::Tensor x = (w == 0 ? q : w == 1 ? k : v).clone(), numeric_x = at::zeros_like(x, at::kDouble);
    auto flat = x.view(-1);
    for (int64_t i = 0; i < flat.numel(); ++i) {
      const double orig = flat[i].item<double>();
      auto at_value = [&](double value) {
        flat[i].fill_(value);
        return loss(w == 0 ? x : q, w == 1 ? x : k, w == 2 ? x : v);
      };
      numeric_x.view(-1)[i].fill_((at_value(orig + h) - at_value(orig - h)) / (2 * h));
      flat[i].fill_(orig);
    }
    *grads[w] = numeric_x;
  }
  return numeric;
}

// close_rel_max for the output and each gradient.
inline ::testing::AssertionResult grads_close(const AttentionGrads& actual, const AttentionGrads& expected,
                                              double tol) {
  const std::pair<const char*, std::pair<at::Tensor, at::Tensor>> parts[] = {{"out", {actual.out, expected.out}},
                                                                             {"dq", {actual.dq, expected.dq}},
                                                                             {"dk", {actual.dk, expected.dk}},
                                                                             {"dv", {actual.dv, expected.dv}}};
  for (const auto& [name, tensors] : parts) {
    ::testing::AssertionResult result = close_rel_max(tensors.first, tensors.second, tol);
    if (!result) return result << " (" << name << ")";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace sd::test
