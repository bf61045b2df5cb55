#include "models/fused_activations.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "attention_test_util.h"
#include "core/error.h"
#include "test_util.h"

namespace sd::models {
namespace {

using sd::test::vector_widths;
using sd::test::VectorWidth;

// Each value within one rounding to actual's dtype of the float64 truth, plus `relative` of itself, or `absolute`
// (per value or one for all) of it near zero: for bf16 2⁻⁸ of itself (rounding a float32 result once), for float32
// 2⁻²⁰ (a float32 exp a few ulps off, and the products' roundings).
::testing::AssertionResult rounded_once(const at::Tensor& actual, const at::Tensor& truth, const at::Tensor& absolute,
                                        double relative = 0) {
  const at::Tensor a = actual.to(at::kDouble), t = truth.to(at::kDouble);
  const double rounding = std::ldexp(1.0, actual.scalar_type() == at::kBFloat16 ? -8 : -20) + relative;
  const at::Tensor excess = (a - t).abs() - (t.abs() * rounding + absolute);
  if (excess.max().item<double>() <= 0) return ::testing::AssertionSuccess();
  const int64_t worst = excess.flatten().argmax().item<int64_t>();
  return ::testing::AssertionFailure() << "element " << worst << ": " << a.flatten()[worst].item<double>()
                                       << " against " << t.flatten()[worst].item<double>();
}

::testing::AssertionResult rounded_once(const at::Tensor& actual, const at::Tensor& truth, double absolute,
                                        double relative = 0) {
  return rounded_once(actual, truth, at::scalar_tensor(absolute, at::kDouble), relative);
}

// SiLU's value and gradient in float64 from the same values.
at::Tensor silu_truth(const at::Tensor& x) { return at::silu(x.to(at::kDouble)); }
at::Tensor silu_gradient_truth(const at::Tensor& dy, const at::Tensor& x) {
  const at::Tensor s = at::sigmoid(x.to(at::kDouble));
  return dy.to(at::kDouble) * s * (1 + x.to(at::kDouble) * (1 - s));
}
// What float32 arithmetic may lose of the gradient where 1 + x · (1 − σ) cancels (SiLU's minimum, x ≈ -1.28): a few
// ulps of its terms' size, |dy · σ| · (1 + |x| · (1 − σ)).
at::Tensor silu_gradient_cancellation(const at::Tensor& dy, const at::Tensor& x) {
  const at::Tensor s = at::sigmoid(x.to(at::kDouble));
  return std::ldexp(1.0, -21) * (dy.to(at::kDouble) * s).abs() * (1 + x.to(at::kDouble).abs() * (1 - s));
}

// Values across SiLU's range, past exp's clamps at both ends, in a count no multiple of a vector.
at::Tensor test_values(at::ScalarType dtype) {
  at::manual_seed(11);
  return at::cat({at::randn({1000}) * 4,
                  at::tensor({-200.f, -90.f, -88.f, -20.f, -1e-3f, 0.f, 1e-3f, 20.f, 90.f, 200.f, 3e38f})})
      .to(dtype);
}

const at::ScalarType kDtypes[] = {at::kFloat, at::kBFloat16};

// An op's output at x and the gradient of x for the output's gradient dy.
std::pair<at::Tensor, at::Tensor> value_and_gradient(const std::function<at::Tensor(const at::Tensor&)>& op,
                                                     const at::Tensor& x, const at::Tensor& dy) {
  const at::Tensor leaf = x.detach().requires_grad_();
  const at::Tensor y = op(leaf);
  return {y, torch::autograd::grad({y}, {leaf}, {dy})[0]};
}

TEST(FusedSilu, ValueAndGradientAreTheFloat64ResultsRoundedOnce) {
  for (const auto dtype : kDtypes) {
    const at::Tensor x = test_values(dtype), dy = at::randn(x.sizes()).to(dtype);
    for (const int bits : vector_widths()) {
      SCOPED_TRACE(::testing::Message() << c10::toString(dtype) << ", " << bits << "-bit vectors");
      const VectorWidth width(bits);
      const auto [y, dx] = value_and_gradient(fused_silu, x, dy);
      EXPECT_EQ(y.scalar_type(), dtype);
      EXPECT_EQ(dx.scalar_type(), dtype);
      EXPECT_TRUE(rounded_once(y, silu_truth(x), 1e-30));
      EXPECT_TRUE(rounded_once(dx, silu_gradient_truth(dy, x), silu_gradient_cancellation(dy, x) + 1e-30));
    }
  }
}

// Non-finite inputs stay non-finite, so a diverging run is caught as with LibTorch (which gives NaN for -inf, where
// exp's clamp gives -inf here).
TEST(FusedSilu, NonFiniteValuesStayNonFinite) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const auto dtype : kDtypes) {
    SCOPED_TRACE(c10::toString(dtype));
    const at::Tensor y = fused_silu(at::tensor({-inf, inf, nan}).to(dtype)).to(at::kFloat);
    EXPECT_EQ(y[0].item<float>(), -inf);
    EXPECT_EQ(y[1].item<float>(), inf);
    EXPECT_TRUE(std::isnan(y[2].item<float>()));
  }
}

TEST(FusedSilu, NonContiguousInputsAndBadInputs) {
  for (const auto dtype : kDtypes) {
    const at::Tensor x = test_values(dtype).narrow(0, 0, 1000).view({25, 40}).t();
    EXPECT_TRUE(at::equal(fused_silu(x), fused_silu(x.contiguous()))) << c10::toString(dtype);
  }
  EXPECT_EQ(sd::test::error_of([] { fused_silu(at::ones({3}, at::kDouble)); }),
            "fused_silu: expected a float32 or bf16 CPU tensor on an AVX2 CPU, got Double on cpu");
}

// GEGLU's value and gradient in float64 from the same values, with the roundings to their dtype the kernel makes (of
// GELU's output and of d_out · a, as LibTorch's ops store them). Φ from erfc: LibTorch's GELU, even in float64,
// computes 1 + erf(x/√2), which cancels to nothing below x = -8 (Φ(-8) = 6e-16).
at::Tensor rounded_to(const at::Tensor& x, at::ScalarType dtype) { return x.to(dtype).to(at::kDouble); }
at::Tensor normal_cdf_truth(const at::Tensor& g) { return 0.5 * at::erfc(-g * M_SQRT1_2); }
at::Tensor gelu_derivative_truth(const at::Tensor& g) {
  return normal_cdf_truth(g) + g * at::exp(-0.5 * g * g) / std::sqrt(2 * M_PI);
}

TEST(FusedGeglu, ValueAndGradientAreTheFloat64ResultsRoundedOnce) {
  for (const auto dtype : kDtypes) {
    at::manual_seed(5);
    // Rows of 2 x 37 values (37: no multiple of a vector), the gate across GELU's range and into both tails.
    const at::Tensor h = at::cat({at::randn({3, 37}), at::randn({3, 37}) * 4}, 1).to(dtype);
    const at::Tensor d_out = at::randn({3, 37}).to(dtype);
    const at::Tensor a = h.narrow(1, 0, 37).to(at::kDouble), g = h.narrow(1, 37, 37).to(at::kDouble),
                     d = d_out.to(at::kDouble);
    const at::Tensor gelu = rounded_to(g * normal_cdf_truth(g), dtype);
    const at::Tensor dh_truth = at::cat({d * gelu, rounded_to(d * a, dtype) * gelu_derivative_truth(g)}, 1);
    for (const int bits : vector_widths()) {
      SCOPED_TRACE(::testing::Message() << c10::toString(dtype) << ", " << bits << "-bit vectors");
      const VectorWidth width(bits);
      const auto [out, dh] = value_and_gradient(fused_geglu, h, d_out);
      ASSERT_EQ(out.sizes(), d_out.sizes());
      EXPECT_EQ(dh.scalar_type(), dtype);
      // Φ's negative tail is e^(p − z²) (normal_cdf in fused_activations_rows.inl): its float32 argument, up to ~60
      // where Φ(g) is above 1e-30, holds |p − z²| · 2⁻²⁴ of error, up to 4e-6 of Φ.
      const double tail = dtype == at::kFloat ? 4e-6 : 0;
      EXPECT_TRUE(rounded_once(out, a * gelu, 1e-30, tail));
      EXPECT_TRUE(rounded_once(dh, dh_truth, 1e-30, tail));
    }
  }
}

// The same as LibTorch's path (chunk, GELU, product) up to the roundings both make, on tiny-sd1's shapes.
TEST(FusedGeglu, AgreesWithLibTorchsPath) {
  for (const auto dtype : kDtypes) {
    SCOPED_TRACE(c10::toString(dtype));
    at::manual_seed(6);
    const at::Tensor h = (at::randn({2, 64, 256}) * 2).to(dtype), d_out = at::randn({2, 64, 128}).to(dtype);
    const auto [fused_out, fused_dh] = value_and_gradient(fused_geglu, h, d_out);
    const auto [plain_out, plain_dh] = value_and_gradient(
        [](const at::Tensor& x) {
          const auto parts = x.chunk(2, -1);
          return parts[0] * at::gelu(parts[1].contiguous());
        },
        h, d_out);
    const double tol = dtype == at::kFloat ? 1e-6 : 1e-2;
    EXPECT_TRUE(sd::test::close_rel_max(fused_out, plain_out, tol));
    EXPECT_TRUE(sd::test::close_rel_max(fused_dh, plain_dh, tol));
  }
}

TEST(FusedGeglu, BadInputsAreNamed) {
  EXPECT_EQ(sd::test::error_of([] {
              fused_geglu(at::ones({2, 5}, at::kBFloat16));
            }),
            "fused_geglu: expected a projection [..., 2n] with an even, non-zero last dimension, got [2, 5]");
  EXPECT_EQ(sd::test::error_of([] {
              fused_geglu(at::ones({2, 4}, at::kDouble));
            }),
            "fused_geglu: expected a float32 or bf16 CPU tensor on an AVX2 CPU, got Double on cpu");
}

}  // namespace
}  // namespace sd::models
