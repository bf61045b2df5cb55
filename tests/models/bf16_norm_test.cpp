#include "models/bf16_norm.h"

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

// Each value within a bf16 rounding (2⁻⁸ of itself) of the float64 truth, plus `slack` of the largest truth: what
// rounding a float32 result once to bf16 allows.
::testing::AssertionResult rounded_once(const at::Tensor& actual, const at::Tensor& truth, double slack) {
  const at::Tensor a = actual.to(at::kDouble), t = truth.to(at::kDouble);
  const at::Tensor allowed = t.abs() * std::ldexp(1.0, -8) + slack * t.abs().max();
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
  if (c.groups) return [g = c.groups](auto& x, auto& w, auto& b) { return bf16_group_norm(x, g, w, b, 1e-5); };
  return [n = c.shape.back()](auto& x, auto& w, auto& b) { return bf16_layer_norm(x, {n}, w, b, 1e-5); };
}

// LibTorch's norm in whatever dtype its inputs have: the float64 truth.
Norm reference_norm(const Case& c) {
  if (c.groups) return [g = c.groups](auto& x, auto& w, auto& b) { return at::group_norm(x, g, w, b, 1e-5); };
  return [n = c.shape.back()](auto& x, auto& w, auto& b) { return at::layer_norm(x, {n}, w, b, 1e-5); };
}

struct Inputs {
  at::Tensor x, weight, bias, w;
};

// bf16 inputs away from zero mean (as activations are), parameters of the given dtype, and an output weighting that
// bf16 holds exactly (it is the gradient reaching the bf16 output).
Inputs random_inputs(const Case& c, at::ScalarType parameter_dtype) {
  const int64_t channels = c.groups ? c.shape[1] : c.shape.back();
  return {(at::randn(c.shape) * 3 + 2).to(at::kBFloat16), (at::randn({channels}) + 1).to(parameter_dtype),
          at::randn({channels}).to(parameter_dtype), at::randn(c.shape).to(at::kBFloat16).to(at::kFloat)};
}

NormResult truth(const Case& c, const Inputs& in) {
  return run(reference_norm(c), in.x.to(at::kDouble), in.weight.to(at::kDouble), in.bias.to(at::kDouble), in.w);
}

TEST(Bf16Norm, OutputIsTheFloat64ResultRoundedOnceAndGradientsAreClose) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    for (const auto dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(c10::toString(dtype));
      at::manual_seed(c.shape.size() + c.groups);
      const Inputs in = random_inputs(c, dtype);
      const NormResult expected = truth(c, in);
      for (const int bits : vector_widths()) {
        SCOPED_TRACE(::testing::Message() << bits << "-bit vectors");
        const VectorWidth width(bits);
        const NormResult got = run(sdtrain_norm(c), in.x, in.weight, in.bias, in.w);
        EXPECT_EQ(got.out.scalar_type(), at::kBFloat16);
        EXPECT_EQ(got.dx.scalar_type(), at::kBFloat16);
        EXPECT_EQ(got.dweight.scalar_type(), dtype);
        EXPECT_TRUE(rounded_once(got.out, expected.out, 1e-5));
        // dx = rstd·g − k·x + c cancels as LibTorch's float32 backward does: a float32 step of the terms.
        EXPECT_TRUE(rounded_once(got.dx, expected.dx, 1e-4));
        const double tol = dtype == at::kFloat ? 1e-5 : 1e-2;
        EXPECT_TRUE(close_rel_max(got.dweight, expected.dweight, tol));
        EXPECT_TRUE(close_rel_max(got.dbias, expected.dbias, tol));
      }
    }
  }
}

TEST(Bf16Norm, SameBitsWhateverTheThreads) {
  const int threads = at::get_num_threads();
  for (const Case& c : {Case{{2, 320, 16, 16}, 32}, Case{{2, 256, 320}, 0}}) {
    SCOPED_TRACE(describe(c));
    at::manual_seed(7);
    const Inputs in = random_inputs(c, at::kFloat);
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
  at::set_num_threads(threads);
}

// A frozen norm (textual inversion's UNet) yields no parameter gradients, and a constant row (variance 0) stays
// finite: the output is beta.
TEST(Bf16Norm, FrozenParametersAndConstantRows) {
  const at::Tensor x = at::full({2, 4, 3, 3}, 1.5, at::kBFloat16).requires_grad_();
  const at::Tensor weight = at::ones({4}, at::kBFloat16), bias = at::arange(4, at::kFloat).to(at::kBFloat16);
  const at::Tensor out = bf16_group_norm(x, 2, weight, bias, 1e-6);
  EXPECT_TRUE(at::equal(out, bias.view({1, 4, 1, 1}).expand({2, 4, 3, 3})));
  const auto grads = torch::autograd::grad({out.to(at::kFloat).pow(2).sum()}, {x});
  EXPECT_TRUE(at::isfinite(grads[0]).all().item<bool>());
  EXPECT_FALSE(weight.grad().defined());
}

TEST(Bf16Norm, BadInputsAreNamed) {
  const at::Tensor x = at::ones({2, 6, 4}, at::kBFloat16), p6 = at::ones({6}), p4 = at::ones({4});
  EXPECT_EQ(sd::test::error_of([&] { bf16_group_norm(x, 4, p6, p6, 1e-5); }),
            "bf16_group_norm: expected x [N, C, ...] with C divisible by 4 groups and weight and bias of C values, got "
            "x [2, 6, 4], weight [6], bias [6]");
  EXPECT_EQ(sd::test::error_of([&] { bf16_layer_norm(x, {4}, p6, p4, 1e-5); }),
            "bf16_layer_norm: expected x [..., 4] and weight and bias of that shape, got x [2, 6, 4], weight [6], "
            "bias [4]");
  EXPECT_EQ(sd::test::error_of([&] { bf16_layer_norm(x.to(at::kFloat), {4}, p4, p4, 1e-5); }),
            "bf16_layer_norm: expected a bf16 CPU input with float32 or bf16 weight and bias on an AVX2 CPU, got "
            "Float x, Float weight");
}

}  // namespace
}  // namespace sd::models
