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
