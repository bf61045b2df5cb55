#include "models/fused_norm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <vector>

#include "attention_test_util.h"
#include "core/error.h"
#include "test_util.h"

namespace sd::models {
namespace {

using sd::test::close_rel_max;
using sd::test::vector_widths;
using sd::test::VectorWidth;

// A norm's output and the gradients of Σ out · w with respect to its input and parameters.
struct NormResult {
  at::Tensor out, dx, dweight, dbias;
};

using Norm = std::function<at::Tensor(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias)>;

NormResult run(const Norm& norm, const at::Tensor& x_in, const at::Tensor& weight_in, const at::Tensor& bias_in,
               const at::Tensor& w) {
  const at::Tensor x = x_in.detach().requires_grad_(), weight = weight_in.detach().requires_grad_(),
                   bias = bias_in.detach().requires_grad_();
  const at::Tensor out = norm(x, weight, bias);
  const auto grads = torch::autograd::grad({(out.to(at::kDouble) * w.to(at::kDouble)).sum()}, {x, weight, bias});
  return {out.detach(), grads[0], grads[1], grads[2]};
}

// Each value within a rounding to actual's dtype of the float64 truth, plus `slack` of the largest truth: for bf16,
// 2⁻⁸ of itself (rounding a float32 result once), for float32 2⁻²⁰ (a few ulps of float32 arithmetic).
::testing::AssertionResult rounded_once(const at::Tensor& actual, const at::Tensor& truth, double slack) {
  const at::Tensor a = actual.to(at::kDouble), t = truth.to(at::kDouble);
  const double rounding = std::ldexp(1.0, actual.scalar_type() == at::kBFloat16 ? -8 : -20);
  const at::Tensor allowed = t.abs() * rounding + slack * t.abs().max();
  const at::Tensor excess = (a - t).abs() - allowed;
  if (excess.max().item<double>() <= 0) return ::testing::AssertionSuccess();
  const int64_t worst = excess.flatten().argmax().item<int64_t>();
  return ::testing::AssertionFailure() << "element " << worst << ": " << a.flatten()[worst].item<double>()
                                       << " against " << t.flatten()[worst].item<double>();
}

// A norm problem: the input's shape, and the group count (0: layer norm over the last dimension).
struct Case {
  std::vector<int64_t> shape;
  int64_t groups;
};

std::string describe(const Case& c) {
  return (c.groups ? "group norm in " + std::to_string(c.groups) + " groups over [" : "layer norm over [") +
         fmt::format("{}", fmt::join(c.shape, ", ")) + "]";
}

// tiny-sd1's norms (32 groups over 32 and 64 channels at 8x8 and 4x4 latents, layer norms over 32 and 64
// features), SD's (32 groups over 320 channels), segments and rows shorter than a vector and no multiple of one, a
// group norm over one pixel, and several groups per parameter set.
const std::vector<Case> kCases = {{{2, 32, 8, 8}, 32}, {{2, 64, 4, 4}, 32}, {{1, 320, 6, 5}, 32}, {{2, 6, 3, 1}, 3},
                                  {{3, 8}, 2},         {{2, 64, 32}, 0},    {{2, 5, 77}, 0},      {{4, 7}, 0}};

Norm sdtrain_norm(const Case& c) {
  if (c.groups) return [g = c.groups](auto& x, auto& w, auto& b) { return fused_group_norm(x, g, w, b, 1e-5); };
  return [n = c.shape.back()](auto& x, auto& w, auto& b) { return fused_layer_norm(x, {n}, w, b, 1e-5); };
}

// LibTorch's norm in whatever dtype its inputs have: the float64 truth.
Norm reference_norm(const Case& c) {
  if (c.groups) return [g = c.groups](auto& x, auto& w, auto& b) { return at::group_norm(x, g, w, b, 1e-5); };
  return [n = c.shape.back()](auto& x, auto& w, auto& b) { return at::layer_norm(x, {n}, w, b, 1e-5); };
}

struct Inputs {
  at::Tensor x, weight, bias, w;
};

// Inputs of the given dtype away from zero mean (as activations are), parameters of theirs, and an output weighting
// that the input's dtype holds exactly (it is the gradient reaching the output).
Inputs random_inputs(const Case& c, at::ScalarType dtype, at::ScalarType parameter_dtype) {
  const int64_t channels = c.groups ? c.shape[1] : c.shape.back();
  return {(at::randn(c.shape) * 3 + 2).to(dtype), (at::randn({channels}) + 1).to(parameter_dtype),
          at::randn({channels}).to(parameter_dtype), at::randn(c.shape).to(dtype).to(at::kFloat)};
}

NormResult truth(const Case& c, const Inputs& in) {
  return run(reference_norm(c), in.x.to(at::kDouble), in.weight.to(at::kDouble), in.bias.to(at::kDouble), in.w);
}

TEST(FusedNorm, OutputIsTheFloat64ResultRoundedOnceAndGradientsAreClose) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    for (const auto dtype : {at::kFloat, at::kBFloat16}) {
      for (const auto parameter_dtype : {at::kFloat, at::kBFloat16}) {
        SCOPED_TRACE(fmt::format("{} input, {} parameters", c10::toString(dtype), c10::toString(parameter_dtype)));
        at::manual_seed(c.shape.size() + c.groups);
        const Inputs in = random_inputs(c, dtype, parameter_dtype);
        const NormResult expected = truth(c, in);
        for (const int bits : vector_widths()) {
          SCOPED_TRACE(::testing::Message() << bits << "-bit vectors");
          const VectorWidth width(bits);
          const NormResult got = run(sdtrain_norm(c), in.x, in.weight, in.bias, in.w);
          EXPECT_EQ(got.out.scalar_type(), dtype);
          EXPECT_EQ(got.dx.scalar_type(), dtype);
          EXPECT_EQ(got.dweight.scalar_type(), parameter_dtype);
          EXPECT_TRUE(rounded_once(got.out, expected.out, dtype == at::kFloat ? 1e-6 : 1e-5));
          // dx = rstd·g − k·x + c cancels as LibTorch's float32 backward does: a float32 step of the terms.
          EXPECT_TRUE(rounded_once(got.dx, expected.dx, dtype == at::kFloat ? 1e-5 : 1e-4));
          const double tol = parameter_dtype == at::kFloat ? 1e-5 : 1e-2;
          EXPECT_TRUE(close_rel_max(got.dweight, expected.dweight, tol));
          EXPECT_TRUE(close_rel_max(got.dbias, expected.dbias, tol));
        }
      }
    }
  }
}

TEST(FusedNorm, SameBitsWhateverTheThreads) {
  const int threads = at::get_num_threads();
  for (const Case& c : {Case{{2, 320, 16, 16}, 32}, Case{{2, 256, 320}, 0}}) {
    SCOPED_TRACE(describe(c));
    for (const auto dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(c10::toString(dtype));
      at::manual_seed(7);
      const Inputs in = random_inputs(c, dtype, at::kFloat);
      at::set_num_threads(1);
      const NormResult one = run(sdtrain_norm(c), in.x, in.weight, in.bias, in.w);
      for (int n : {2, 3}) {
        at::set_num_threads(n);
        const NormResult many = run(sdtrain_norm(c), in.x, in.weight, in.bias, in.w);
        EXPECT_TRUE(at::equal(many.out, one.out)) << n << " threads";
        EXPECT_TRUE(at::equal(many.dx, one.dx)) << n << " threads";
        EXPECT_TRUE(at::equal(many.dweight, one.dweight)) << n << " threads";
        EXPECT_TRUE(at::equal(many.dbias, one.dbias)) << n << " threads";
      }
    }
  }
  at::set_num_threads(threads);
}

// A frozen norm (textual inversion's UNet) yields no parameter gradients, and a constant row (variance 0) stays
// finite: the output is beta.
TEST(FusedNorm, FrozenParametersAndConstantRows) {
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const at::Tensor x = at::full({2, 4, 3, 3}, 1.5, dtype).requires_grad_();
    const at::Tensor weight = at::ones({4}, dtype), bias = at::arange(4, at::kFloat).to(dtype);
    const at::Tensor out = fused_group_norm(x, 2, weight, bias, 1e-6);
    EXPECT_TRUE(at::equal(out, bias.view({1, 4, 1, 1}).expand({2, 4, 3, 3})));
    const auto grads = torch::autograd::grad({out.to(at::kFloat).pow(2).sum()}, {x});
    EXPECT_TRUE(at::isfinite(grads[0]).all().item<bool>());
    EXPECT_FALSE(weight.grad().defined());
  }
}

TEST(FusedNorm, BadInputsAreNamed) {
  const at::Tensor x = at::ones({2, 6, 4}, at::kBFloat16), p6 = at::ones({6}), p4 = at::ones({4});
  EXPECT_EQ(
      sd::test::error_of([&] { fused_group_norm(x, 4, p6, p6, 1e-5); }),
      "fused_group_norm: expected x [N, C, ...] with C divisible by 4 groups and weight and bias of C values, got "
      "x [2, 6, 4], weight [6], bias [6]");
  EXPECT_EQ(sd::test::error_of([&] { fused_layer_norm(x, {4}, p6, p4, 1e-5); }),
            "fused_layer_norm: expected x [..., 4] and weight and bias of that shape, got x [2, 6, 4], weight [6], "
            "bias [4]");
  EXPECT_EQ(sd::test::error_of([&] { fused_layer_norm(x.to(at::kDouble), {4}, p4, p4, 1e-5); }),
            "fused_layer_norm: expected a float32 or bf16 CPU input with float32 or bf16 weight and bias on an AVX2 "
            "CPU, got Double x, Float weight");
}

}  // namespace
}  // namespace sd::models
