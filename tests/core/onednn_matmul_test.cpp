#include "core/onednn_matmul.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "core/cpu_features.h"

namespace sd {
namespace {

at::Tensor random_bf16(at::IntArrayRef sizes, bool transposed) {
  if (!transposed) return at::randn(sizes).to(at::kBFloat16);
  return at::randn({sizes[1], sizes[0]}).to(at::kBFloat16).t();
}

struct Case {
  int64_t m, k, n;
  bool a_transposed, b_transposed, bias;
};

class OnednnMatmulTest : public ::testing::TestWithParam<Case> {};

// The same oneDNN arithmetic as at::mm / at::addmm: the products must agree to the bit, whatever the layouts.
TEST_P(OnednnMatmulTest, MatchesAtenBitForBit) {
  if (!cpu_runs_bf16_in_onednn()) GTEST_SKIP() << "this CPU runs bf16 outside oneDNN";
  const Case c = GetParam();
  at::manual_seed(c.m * 131 + c.k * 7 + c.n);
  const at::Tensor a = random_bf16({c.m, c.k}, c.a_transposed), b = random_bf16({c.k, c.n}, c.b_transposed);
  const at::Tensor bias = c.bias ? at::randn({c.n}).to(at::kBFloat16) : at::Tensor();
  ASSERT_TRUE(onednn_matmul_fits(a, b));
  for (int repeat = 0; repeat < 2; ++repeat) {  // the second call runs the kept primitive
    const at::Tensor got = onednn_matmul(a, b, bias);
    EXPECT_EQ(got.sizes(), (at::IntArrayRef{c.m, c.n}));
    EXPECT_TRUE(got.is_contiguous());
    EXPECT_TRUE(at::equal(got, c.bias ? at::addmm(bias, a, b) : at::mm(a, b)));
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, OnednnMatmulTest,
                         ::testing::Values(Case{512, 64, 64, false, true, true}, Case{512, 64, 64, false, false, false},
                                           Case{64, 512, 96, true, false, false}, Case{33, 17, 8, true, true, true},
                                           Case{1, 32, 129, false, true, true}, Case{2048, 1, 3, false, false, true},
                                           Case{200, 24, 1, true, false, false}));

TEST(OnednnMatmul, KeepsTwoShapesApart) {
  if (!cpu_runs_bf16_in_onednn()) GTEST_SKIP() << "this CPU runs bf16 outside oneDNN";
  const at::Tensor a = at::randn({64, 16}).to(at::kBFloat16), b = at::randn({16, 8}).to(at::kBFloat16);
  const at::Tensor a2 = at::randn({65, 16}).to(at::kBFloat16);
  EXPECT_TRUE(at::equal(onednn_matmul(a, b), at::mm(a, b)));
  EXPECT_TRUE(at::equal(onednn_matmul(a2, b), at::mm(a2, b)));
  EXPECT_TRUE(at::equal(onednn_matmul(a, b), at::mm(a, b)));
}

TEST(OnednnMatmul, TakesOnlyBf16MatricesWithAUnitStride) {
  const at::Tensor a = at::randn({64, 16}).to(at::kBFloat16), b = at::randn({16, 8}).to(at::kBFloat16);
  EXPECT_EQ(onednn_matmul_fits(a, b), cpu_runs_bf16_in_onednn());
  EXPECT_FALSE(onednn_matmul_fits(a.to(at::kFloat), b.to(at::kFloat)));
  EXPECT_FALSE(onednn_matmul_fits(a, b.t()));                                                     // 64x16 by 8x16
  EXPECT_FALSE(onednn_matmul_fits(at::randn({64, 32}).to(at::kBFloat16).slice(1, 0, 32, 2), b));  // stride 2
  EXPECT_FALSE(onednn_matmul_fits(a.unsqueeze(0), b));
  EXPECT_FALSE(onednn_matmul_fits(a.slice(0, 0, 0), b));
}

// at::mm keeps products of up to 16³ multiply-adds in LibTorch's own kernel, and so does onednn_matmul_fits.
TEST(OnednnMatmul, LeavesAtenItsSmallProducts) {
  const at::Tensor a = at::randn({16, 16}).to(at::kBFloat16);
  EXPECT_FALSE(onednn_matmul_fits(a, at::randn({16, 16}).to(at::kBFloat16)));
  EXPECT_EQ(onednn_matmul_fits(a, at::randn({16, 17}).to(at::kBFloat16)), cpu_runs_bf16_in_onednn());
}

}  // namespace
}  // namespace sd
