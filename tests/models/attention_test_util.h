// Helpers shared by the attention kernels' tests: an attention's output and input gradients under a fixed weighting
// of the output, and their comparison.
#pragma once
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

#include "model_test_util.h"
#include "models/diffusers_blocks.h"

namespace sd::test {

// [B, L, heads*d] <-> [B*heads, L, d]
inline at::Tensor split_heads(const at::Tensor& x, int64_t heads) {
  const int64_t b = x.size(0), l = x.size(1), d = x.size(2) / heads;
  return x.reshape({b, l, heads, d}).permute({0, 2, 1, 3}).reshape({b * heads, l, d});
}
inline at::Tensor merge_heads(const at::Tensor& x, int64_t heads) {
  const int64_t bh = x.size(0), l = x.size(1), d = x.size(2);
  return x.reshape({bh / heads, heads, l, d}).permute({0, 2, 1, 3}).reshape({bh / heads, l, heads * d});
}

// diffusers' AttnProcessor on the same projections: the path the fused kernels replace.
inline at::Tensor reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                                      double scale, bool upcast_attention) {
  return merge_heads(models::scaled_attention(split_heads(q, heads), split_heads(k, heads), split_heads(v, heads),
                                              scale, upcast_attention,
                                              /*upcast_softmax=*/false),
                     heads);
}

// One attention problem: batch entries, heads, query and key tokens, channels per head.
struct AttentionCase {
  int64_t batch, heads, lq, lk, d;
};

inline ::testing::Message describe(const AttentionCase& c) {
  return ::testing::Message() << "batch " << c.batch << ", " << c.heads << " heads, " << c.lq << " x " << c.lk
                              << " tokens, d " << c.d;
}

// Random projections q [B, Lq, heads*d], k and v [B, Lk, heads*d], and a weighting of the output.
struct AttentionInputs {
  at::Tensor q, k, v, weight;
};

inline AttentionInputs random_inputs(const AttentionCase& c, at::ScalarType dtype = at::kFloat) {
  return {at::randn({c.batch, c.lq, c.heads * c.d}).to(dtype), at::randn({c.batch, c.lk, c.heads * c.d}).to(dtype),
          at::randn({c.batch, c.lk, c.heads * c.d}).to(dtype), at::randn({c.batch, c.lq, c.heads * c.d}).to(dtype)};
}

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

// Expects a float32 kernel's gradients of sum(attention(q, k, v) * weight) to match central differences. The kernel
// computes in float32, so the step (1e-2) trades truncation (~h²) against rounding (~1e-7 · |loss| / h).
template <typename Fn>
void expect_float32_gradients_match_finite_differences(const Fn& attention, const AttentionInputs& in) {
  const AttentionGrads analytic = attention_grads(attention, in.q, in.k, in.v, in.weight);
  auto loss = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    at::NoGradGuard no_grad;
    const at::Tensor out = attention(q, k, v);
    return (out.to(at::kDouble) * in.weight.to(at::kDouble)).sum().item<double>();
  };
  const AttentionGrads numeric = numeric_attention_grads(loss, in.q, in.k, in.v, /*h=*/1e-2);
  EXPECT_TRUE(close_rel_max(analytic.dq, numeric.dq, 2e-3));
  EXPECT_TRUE(close_rel_max(analytic.dk, numeric.dk, 2e-3));
  EXPECT_TRUE(close_rel_max(analytic.dv, numeric.dv, 2e-3));
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
