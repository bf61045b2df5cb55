// The analytic FLOP count of the UNet (what MFU is computed from) against the FLOPs the convolutions and matrix
// products of a real forward pass perform, counted from their shapes as they run.
#include <gtest/gtest.h>

#include "core/cpu_features.h"
#include "core/onednn_matmul.h"
#include "models/linear.h"
#include "models/tiled_attention.h"
#include "models/unet/unet_2d_condition.h"
#include "models/wide_head_attention.h"
#include "perf/op_profiler.h"
#include "test_util.h"

namespace sd::models {
namespace {

TEST(UNetFlops, AnalyticCountEqualsWhatAForwardPassRuns) {
  for (const std::string pipeline : {"tiny-sd1", "tiny-sd2"}) {
    SCOPED_TRACE(pipeline);
    UNet2DConditionModel unet = load_unet(sd::test::fixtures() / pipeline / "unet");
    const auto& c = unet->config();
    for (auto [h, w] : {std::pair<int64_t, int64_t>{16, 16}, {24, 8}}) {
      const at::Tensor sample = at::randn({2, c.in_channels, h, w});
      const at::Tensor context = at::randn({2, 77, c.cross_attention_dim.at(0)});
      torch::NoGradGuard no_grad;
      perf::OpProfiler profiler(/*count_flops=*/true);
      unet->forward(sample, at::tensor({int64_t{1}, int64_t{500}}), context);
      EXPECT_EQ(count_forward_flops(c, 2, h, w, 77), profiler.profile().matmul_flops) << h << "x" << w;
    }
  }
}

TEST(UNetFlops, StableDiffusion15MatchesTheMeasuredFigures) {
  // DESIGN.md: SD-1.5's UNet forward costs 0.180 TFLOP at 32x32 latents and 0.803 TFLOP at 64x64.
  EXPECT_NEAR(count_forward_flops(UNetConfig::sd15(), 1, 32, 32) / 1e12, 0.180, 0.0015);
  EXPECT_NEAR(count_forward_flops(UNetConfig::sd15(), 1, 64, 64) / 1e12, 0.803, 0.004);
}

TEST(OpProfiler, BackwardCostsTwiceTheForwardForConvolutionsAndTiledAttention) {
  const at::Tensor x = at::randn({2, 8, 40, 40}).requires_grad_(), w = at::randn({8, 8, 3, 3}).requires_grad_();
  const at::Tensor q = at::randn({4, 50, 8}).requires_grad_(), k = at::randn({4, 30, 8}).requires_grad_(),
                   v = at::randn({4, 30, 8}).requires_grad_();
  perf::OpProfiler profiler(/*count_flops=*/true);
  const at::Tensor y = at::conv2d(x, w, {}, /*stride=*/1, /*padding=*/1);  // at::conv2d's one-element defaults
  const int64_t conv_forward = 2 * 2 * 8 * 8 * 9 * 40 * 40;
  const at::Tensor a = tiled_attention(q, k, v, 0.3, false);
  const int64_t attention_forward = 2 * 4 * 50 * 30 * (8 + 8);
  EXPECT_EQ(profiler.profile().flops.at("conv"), conv_forward);
  EXPECT_EQ(profiler.profile().flops.at("attention"), attention_forward);
  (y.sum() + a.sum()).backward();
  EXPECT_EQ(profiler.profile().flops.at("conv"), 3 * conv_forward);
  EXPECT_EQ(profiler.profile().flops.at("attention"), 3 * attention_forward);
  EXPECT_EQ(profiler.profile().flops.count("linear"), 0u) << "the tiled attention's own GEMMs are not counted again";
}

TEST(OpProfiler, WideHeadAttentionCountsBackwardAsTwiceItsForwardInEachDtype) {
  std::vector<at::ScalarType> dtypes{at::kFloat};
  if (cpu_runs_bf16_in_onednn()) dtypes.push_back(at::kBFloat16);  // which the kernel reads in a layout of its own
  for (const at::ScalarType dtype : dtypes) {
    SCOPED_TRACE(c10::toString(dtype));
    const at::Tensor q = at::randn({2, 50, 3 * 24}).to(dtype).requires_grad_(),
                     k = at::randn({2, 30, 3 * 24}).to(dtype).requires_grad_(),
                     v = at::randn({2, 30, 3 * 24}).to(dtype).requires_grad_();
    perf::OpProfiler profiler(/*count_flops=*/true);
    const at::Tensor a = wide_head_attention(q, k, v, /*heads=*/3, 0.2);
    const int64_t attention_forward = 2 * 2 * 50 * 30 * (72 + 72);
    EXPECT_EQ(profiler.profile().flops.at("attention"), attention_forward);
    a.sum().backward();
    EXPECT_EQ(profiler.profile().flops.at("attention"), 3 * attention_forward);
    EXPECT_EQ(profiler.profile().flops.count("linear"), 0u);
  }
}

// sdtrain's bf16 products run outside at::mm (core/onednn_matmul.h) and count as it would, a linear layer's weight
// given as it is held, [out, in].
TEST(OpProfiler, CountsOnednnProductsAsAtMmWould) {
  if (!cpu_runs_bf16_in_onednn()) GTEST_SKIP() << "this CPU runs bf16 outside oneDNN";
  const at::Tensor x = at::randn({64, 48}).to(at::kBFloat16), w = at::randn({80, 48}).to(at::kBFloat16);
  perf::OpProfiler profiler(/*count_flops=*/true);
  linear(x, w, at::Tensor());
  EXPECT_EQ(profiler.profile().flops.at("linear"), 2 * 64 * 48 * 80);
  sd::mm(x, w.t());
  EXPECT_EQ(profiler.profile().flops.at("linear"), 2 * 2 * 64 * 48 * 80);
  EXPECT_EQ(profiler.profile().by_op.at("sdtrain::mm").calls, 2);
}

// Each product is totalled by op and input shapes, a transposed view marked, with the FLOPs the class totals count.
TEST(OpProfiler, TotalsProductsByOpAndInputShapes) {
  const at::Tensor a = at::randn({6, 8}), b = at::randn({8, 5}), b_transposed = at::randn({5, 8}).t();
  const at::Tensor x = at::randn({1, 2, 6, 6}), w = at::randn({3, 2, 3, 3});
  perf::OpProfiler profiler(/*count_flops=*/true);
  at::mm(a, b);
  at::mm(a, b);
  at::mm(a, b_transposed);
  at::conv2d(x, w, {}, /*stride=*/1, /*padding=*/1);
  const perf::OpProfile profile = profiler.profile();
  std::string names;
  for (const auto& [name, totals] : profile.products) names += "'" + name + "' ";
  ASSERT_EQ(profile.products.size(), 3u) << names;
  for (const char* name : {"aten::mm 6x8 8x5", "aten::mm 6x8 8x5^T", "aten::convolution 1x2x6x6 3x2x3x3"})
    ASSERT_EQ(profile.products.count(name), 1u) << name << " among " << names;
  const perf::ProductTotals& plain = profile.products.at("aten::mm 6x8 8x5");
  EXPECT_EQ(plain.calls, 2);
  EXPECT_EQ(plain.flops, 2 * 2 * 6 * 8 * 5);
  EXPECT_GT(plain.seconds, 0);
  const perf::ProductTotals& transposed = profile.products.at("aten::mm 6x8 8x5^T");
  EXPECT_EQ(transposed.calls, 1);
  EXPECT_EQ(transposed.flops, 2 * 6 * 8 * 5);
  const perf::ProductTotals& conv = profile.products.at("aten::convolution 1x2x6x6 3x2x3x3");
  EXPECT_EQ(conv.flops, profile.flops.at("conv"));
  EXPECT_EQ(plain.flops + transposed.flops, profile.flops.at("linear"));
}

TEST(OpProfiler, KeepsNoProductsWithoutCountingFlops) {
  perf::OpProfiler profiler;
  at::mm(at::randn({4, 4}), at::randn({4, 4}));
  EXPECT_EQ(profiler.profile().by_op.at("aten::mm").calls, 1);
  EXPECT_TRUE(profiler.profile().products.empty());
}

TEST(OpProfiler, ClassifiesOpsAndScopes) {
  EXPECT_EQ(perf::classify_op("aten::convolution_backward"), perf::OpClass::kConv);
  EXPECT_EQ(perf::classify_op("aten::baddbmm"), perf::OpClass::kAttention);
  EXPECT_EQ(perf::classify_op("aten::_softmax_backward_data"), perf::OpClass::kAttention);
  EXPECT_EQ(perf::classify_op("aten::addmm"), perf::OpClass::kLinear);
  EXPECT_EQ(perf::classify_op("aten::native_group_norm_backward"), perf::OpClass::kNorm);
  EXPECT_EQ(perf::classify_op("sdtrain::norm_backward"), perf::OpClass::kNorm);
  EXPECT_EQ(perf::classify_op("aten::silu"), perf::OpClass::kElementwise);
  at::Tensor a = at::randn({256, 256});
  perf::OpProfiler profiler;
  {
    SD_PERF_SCOPE("sdtrain::optimizer");
    for (int i = 0; i < 20; ++i) a.mul_(1.0001);
  }
  for (int i = 0; i < 20; ++i) at::mm(a, a);
  const perf::OpProfile profile = profiler.profile();
  const auto& seconds = profile.seconds;
  EXPECT_GT(seconds.at("optimizer"), 0.0);
  EXPECT_GT(seconds.at("linear"), 0.0);
  EXPECT_EQ(seconds.count("elementwise"), 0u) << "the muls ran inside the optimizer scope, the allocations in mm";
  EXPECT_EQ(profile.by_op.at("aten::mm").calls, 20);
  EXPECT_EQ(profile.by_op.at("aten::mul_").calls, 20);
  EXPECT_EQ(profile.by_op.at("sdtrain::optimizer").calls, 1);
}

}  // namespace
}  // namespace sd::models
