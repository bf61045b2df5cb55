#include "models/linear.h"

#include "core/cpu_features.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace sd::models {
namespace {

struct Grads {
  at::Tensor y, dx, dw, db;
};

// y and the gradients of Σ y·g (a fixed random g) for x, weight and bias, each only where it requires one.
template <class Linear>
Grads run(Linear linear_fn, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
          const at::Tensor& g) {
  const at::Tensor y = linear_fn(x, weight, bias);
  (y * g).sum().backward();
  Grads r{y.detach(), x.grad(), weight.grad(), bias.defined() ? bias.grad() : at::Tensor()};
  for (const at::Tensor& t : {x, weight, bias})
    if (t.defined() && t.grad().defined()) t.mutable_grad().reset();
  return r;
}

at::Tensor leaf(at::IntArrayRef sizes, at::ScalarType dtype, bool requires_grad) {
  return at::randn(sizes).to(dtype).set_requires_grad(requires_grad);
}

void expect_same(const at::Tensor& got, const at::Tensor& want, const char* what) {
  ASSERT_EQ(got.defined(), want.defined()) << what;
  if (!want.defined()) return;
  EXPECT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(at::equal(got, want)) << what << ": max difference "
                                    << (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<float>();
}

struct Case {
  std::vector<int64_t> x_sizes;
  int64_t out;
  bool bias, weight_grad;
};

class LinearTest : public ::testing::TestWithParam<Case> {};

// Output and gradients agree with at::linear's to the bit (the same products, oneDNN's for bf16, and bias sum), and
// a frozen weight gets no gradient.
TEST_P(LinearTest, MatchesAtenLinearToTheBit) {
  const Case c = GetParam();
  for (const auto dtype : {at::kBFloat16, at::kFloat}) {
    SCOPED_TRACE(c10::toString(dtype));
    at::manual_seed(c.out + static_cast<int64_t>(c.x_sizes.size()));
    const at::Tensor x = leaf(c.x_sizes, dtype, true), weight = leaf({c.out, c.x_sizes.back()}, dtype, c.weight_grad);
    const at::Tensor bias = c.bias ? leaf({c.out}, dtype, c.weight_grad) : at::Tensor();
    std::vector<int64_t> y_sizes = c.x_sizes;
    y_sizes.back() = c.out;
    const at::Tensor g = at::randn(y_sizes).to(dtype);

    const Grads want = run([](auto&&... a) { return at::linear(a...); }, x, weight, bias, g);
    const Grads got = run([](auto&&... a) { return models::linear(a...); }, x, weight, bias, g);
    expect_same(got.y, want.y, "y");
    expect_same(got.dx, want.dx, "dx");
    expect_same(got.dw, want.dw, "dweight");
    expect_same(got.db, want.db, "dbias");
    EXPECT_EQ(got.dw.defined(), c.weight_grad);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearTest,
                         ::testing::Values(Case{{2, 64, 32}, 96, true, true}, Case{{2, 64, 32}, 96, false, false},
                                           Case{{128, 40}, 24, true, false}, Case{{5}, 3, true, true},
                                           Case{{2, 3, 7, 16}, 1, false, true}));

TEST(Linear, NonContiguousInputMatchesAtenLinear) {
  for (const auto dtype : {at::kBFloat16, at::kFloat}) {
    at::manual_seed(3);
    const at::Tensor x = at::randn({16, 2, 24}).to(dtype).transpose(0, 1);  // [2, 16, 24], rows not adjacent
    const at::Tensor weight = at::randn({8, 24}).to(dtype), bias = at::randn({8}).to(dtype);
    EXPECT_TRUE(at::equal(models::linear(x, weight, bias), at::linear(x, weight, bias))) << c10::toString(dtype);
  }
}

class Float32FewTokensTest : public ::testing::TestWithParam<Case> {};

// float32 layers of few tokens and a large weight multiply their forward as (W·xᵀ + b)ᵀ on an AVX-512 CPU: the same
// sums in another order of products, so y agrees with at::linear's to float32 rounding, and the backward is
// at::linear's own products, so given the same upstream gradient every gradient is the same bits.
TEST_P(Float32FewTokensTest, TakesTheTransposedProductWithAtenLinearsGradients) {
  if (!cpu_runs_avx512_sgemm()) GTEST_SKIP() << "the transposed product is taken on AVX-512 CPUs only";
  const Case c = GetParam();
  at::manual_seed(c.out);
  const at::Tensor x = at::randn(c.x_sizes).set_requires_grad(true);
  const at::Tensor weight = at::randn({c.out, c.x_sizes.back()}).set_requires_grad(c.weight_grad);
  const at::Tensor bias = c.bias ? at::randn({c.out}).set_requires_grad(c.weight_grad) : at::Tensor();
  ASSERT_TRUE(transposed_product_is_faster(x, weight, bias));
  const at::Tensor g = at::randn({c.x_sizes[0], c.x_sizes[1], c.out});

  const Grads want = run([](auto&&... a) { return at::linear(a...); }, x, weight, bias, g);
  const Grads got = run([](auto&&... a) { return models::linear(a...); }, x, weight, bias, g);
  EXPECT_EQ(got.y.sizes(), want.y.sizes());
  EXPECT_TRUE(got.y.is_contiguous());
  EXPECT_TRUE(at::allclose(got.y, want.y, 1e-5, 1e-4)) << (got.y - want.y).abs().max().item<float>();
  expect_same(got.dx, want.dx, "dx");
  expect_same(got.dw, want.dw, "dweight");
  expect_same(got.db, want.db, "dbias");
}

INSTANTIATE_TEST_SUITE_P(Shapes, Float32FewTokensTest,
                         ::testing::Values(Case{{1, 64, 1024}, 1024, true, true},
                                           Case{{2, 77, 256}, 4096, false, false},
                                           Case{{3, 16, 2048}, 512, true, false}));

// The rule looks at one sample's tokens and the weight's size, never at the batch.
TEST(Linear, TransposedProductOnlyForFewTokensAndLargeFloat32Weights) {
  if (!cpu_runs_avx512_sgemm()) GTEST_SKIP() << "the transposed product is taken on AVX-512 CPUs only";
  const at::Tensor weight = at::empty({1024, 1024}), bias = at::empty({1024});
  EXPECT_TRUE(transposed_product_is_faster(at::empty({1, 80, 1024}), weight, bias));
  EXPECT_TRUE(transposed_product_is_faster(at::empty({16, 64, 1024}), weight, bias));
  EXPECT_FALSE(transposed_product_is_faster(at::empty({1, 81, 1024}), weight, bias));
  EXPECT_FALSE(transposed_product_is_faster(at::empty({4, 15, 1024}), weight, bias));
  EXPECT_FALSE(transposed_product_is_faster(at::empty({64, 1024}), weight, bias));
  EXPECT_FALSE(transposed_product_is_faster(at::empty({1, 64, 1024}), at::empty({1023, 1024}), {}));
  EXPECT_FALSE(transposed_product_is_faster(at::empty({1, 64, 1024}, at::kBFloat16), weight.to(at::kBFloat16), {}));
  // A strided 3-D input with a bias is added in two roundings by at::linear, and stays there.
  EXPECT_FALSE(transposed_product_is_faster(at::empty({64, 2, 1024}).transpose(0, 1), weight, bias));
}

TEST(Linear, OtherDtypesTakeAtenLinear) {
  at::manual_seed(4);
  const at::Tensor x = at::randn({3, 10}, at::kDouble), weight = at::randn({4, 10}, at::kDouble),
                   bias = at::randn({4}, at::kDouble);
  EXPECT_TRUE(at::equal(models::linear(x, weight, bias), at::linear(x, weight, bias)));
}

TEST(Linear, MismatchedShapesFailAsAtenLinearDoes) {
  const at::Tensor x = at::randn({3, 10}).to(at::kBFloat16), weight = at::randn({4, 10}).to(at::kBFloat16);
  EXPECT_THROW(models::linear(x, weight, at::randn({5}).to(at::kBFloat16)), c10::Error);
  EXPECT_THROW(models::linear(x, at::randn({4, 9}).to(at::kBFloat16), {}), c10::Error);
}

}  // namespace
}  // namespace sd::models
