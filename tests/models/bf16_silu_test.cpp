#include "models/bf16_silu.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <limits>
#include <string>

#include "attention_test_util.h"
#include "core/error.h"

namespace sd::models {
namespace {

using sd::test::vector_widths;
using sd::test::VectorWidth;

// Each value within one bf16 rounding (2⁻⁸ of itself) of the float64 truth, or `absolute` of it near zero: what
// rounding a float32 result once allows, with a float32 exp a few ulps off.
::testing::AssertionResult rounded_once(const at::Tensor& actual, const at::Tensor& truth, double absolute) {
  const at::Tensor a = actual.to(at::kDouble), t = truth.to(at::kDouble);
  const at::Tensor excess = (a - t).abs() - (t.abs() * std::ldexp(1.0, -8) + absolute);
  if (excess.max().item<double>() <= 0) return ::testing::AssertionSuccess();
  const int64_t worst = excess.flatten().argmax().item<int64_t>();
  return ::testing::AssertionFailure() << "element " << worst << ": " << a.flatten()[worst].item<double>()
                                       << " against " << t.flatten()[worst].item<double>();
}

// SiLU's value and gradient in float64 from the same bf16 values.
at::Tensor silu_truth(const at::Tensor& x) { return at::silu(x.to(at::kDouble)); }
at::Tensor silu_gradient_truth(const at::Tensor& dy, const at::Tensor& x) {
  const at::Tensor s = at::sigmoid(x.to(at::kDouble));
  return dy.to(at::kDouble) * s * (1 + x.to(at::kDouble) * (1 - s));
}

// Values across SiLU's range, past exp's clamps at both ends, in a count no multiple of a vector.
at::Tensor test_values() {
  at::manual_seed(11);
  return at::cat({at::randn({1000}) * 4,
                  at::tensor({-200.f, -90.f, -88.f, -20.f, -1e-3f, 0.f, 1e-3f, 20.f, 90.f, 200.f, 3e38f})})
      .to(at::kBFloat16);
}

TEST(Bf16Silu, ValueAndGradientAreTheFloat64ResultsRoundedOnce) {
  const at::Tensor x = test_values(), dy = at::randn(x.sizes()).to(at::kBFloat16);
  for (const int bits : vector_widths()) {
    SCOPED_TRACE(::testing::Message() << bits << "-bit vectors");
    const VectorWidth width(bits);
    const at::Tensor leaf = x.detach().requires_grad_();
    const at::Tensor y = bf16_silu(leaf);
    const at::Tensor dx = torch::autograd::grad({y}, {leaf}, {dy})[0];
    EXPECT_EQ(y.scalar_type(), at::kBFloat16);
    EXPECT_EQ(dx.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(rounded_once(y, silu_truth(x), 1e-30));
    EXPECT_TRUE(rounded_once(dx, silu_gradient_truth(dy, x), 1e-30));
  }
}

// Non-finite inputs stay non-finite, so a diverging run is caught as with LibTorch (which gives NaN for -inf, where
// exp's clamp gives -inf here).
TEST(Bf16Silu, NonFiniteValuesStayNonFinite) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor y = bf16_silu(at::tensor({-inf, inf, nan}).to(at::kBFloat16)).to(at::kFloat);
  EXPECT_EQ(y[0].item<float>(), -inf);
  EXPECT_EQ(y[1].item<float>(), inf);
  EXPECT_TRUE(std::isnan(y[2].item<float>()));
}

TEST(Bf16Silu, NonContiguousInputsAndBadInputs) {
  const at::Tensor x = test_values().narrow(0, 0, 1000).view({25, 40}).t();
  EXPECT_TRUE(at::equal(bf16_silu(x), bf16_silu(x.contiguous())));
  try {
    bf16_silu(at::ones({3}));
    ADD_FAILURE() << "no error";
  } catch (const sd::Error& e) {
    EXPECT_EQ(std::string(e.what()), "bf16_silu: expected a bf16 CPU tensor on an AVX2 CPU, got Float on cpu");
  }
}

}  // namespace
}  // namespace sd::models
