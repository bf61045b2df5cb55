#include "models/diffusers_blocks.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>

#include "model_test_util.h"
#include "models/tiled_attention.h"

namespace sd::models {
namespace {

// softmax(q kᵀ · scale) v in float64, the textbook definition.
at::Tensor reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  auto qd = q.to(at::kDouble), kd = k.to(at::kDouble), vd = v.to(at::kDouble);
  return at::bmm(at::softmax(at::bmm(qd, kd.transpose(1, 2)) * scale, -1), vd);
}

TEST(ScaledAttention, SmallShapesNeverPickUpGarbage) {
  // LibTorch 1.13's small baddbmm kernel reads its uninitialised output; freshly freed NaN-filled buffers of the
  // same size make that visible within a few calls. The tiled attention allocates its output uninitialised too.
  for (const bool tiled : {false, true})
    for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16}) {
      for (auto shape : std::vector<std::array<int64_t, 3>>{{9, 3, 7}, {3, 8, 3}, {7, 8, 7}, {16, 8, 77}}) {
        SCOPED_TRACE(::testing::Message() << c10::toString(dtype) << (tiled ? " tiled" : " plain"));
        const auto [lq, d, lk] = shape;
        for (int rep = 0; rep < 50; ++rep) {
          { at::Tensor poison = at::full({4, lq, lk}, NAN, dtype); }
          at::Tensor q = at::randn({4, lq, d}).to(dtype), k = at::randn({4, lk, d}).to(dtype);
          at::Tensor v = at::randn({4, lk, d}).to(dtype);
          const double scale = std::pow(static_cast<double>(d), -0.5);
          { at::Tensor poison = at::full({4, lq, d}, NAN, dtype); }
          at::Tensor out =
              tiled ? tiled_attention(q, k, v, scale, false) : scaled_attention(q, k, v, scale, false, false);
          ASSERT_TRUE(at::isfinite(out).all().item<bool>()) << lq << "x" << d << "x" << lk << " rep " << rep;
          const double tol = dtype == at::kBFloat16 ? sd::test::bf16_tolerance(3e-2)
                             : dtype == at::kFloat  ? 1e-5
                                                    : 1e-12;
          ASSERT_TRUE(sd::test::close_rel_max(out, reference_attention(q, k, v, scale), tol))
              << lq << "x" << d << "x" << lk << " rep " << rep;
        }
      }
    }
}

TEST(ScaledAttention, UpcastComputesScoresAndSoftmaxInFloat32) {
  at::manual_seed(1);
  at::Tensor q = at::randn({2, 40, 16}).to(at::kBFloat16), k = at::randn({2, 30, 16}).to(at::kBFloat16);
  at::Tensor v = at::randn({2, 30, 16}).to(at::kBFloat16);
  const at::Tensor ref = reference_attention(q, k, v, 0.25);
  at::Tensor plain = scaled_attention(q, k, v, 0.25, false, false);
  at::Tensor upcast = scaled_attention(q, k, v, 0.25, true, false);
  at::Tensor softmax_only = scaled_attention(q, k, v, 0.25, false, true);
  EXPECT_EQ(upcast.scalar_type(), at::kBFloat16);
  // The float32 probabilities are rounded to bf16 once instead of after every step.
  EXPECT_LE(sd::test::rel_l2(upcast, ref), sd::test::rel_l2(plain, ref));
  EXPECT_LE(sd::test::rel_l2(softmax_only, ref), 3e-2);
  // float32 inputs: upcasting is a no-op.
  at::Tensor qf = q.to(at::kFloat), kf = k.to(at::kFloat), vf = v.to(at::kFloat);
  EXPECT_TRUE(
      at::equal(scaled_attention(qf, kf, vf, 0.25, true, true), scaled_attention(qf, kf, vf, 0.25, false, false)));
}

TEST(ScaledAttention, LargeInferenceTakesTheTiledPath) {
  at::manual_seed(3);
  at::Tensor q = at::randn({6, 300, 8}), k = at::randn({6, 260, 8}), v = at::randn({6, 260, 8});
  at::Tensor batched = scaled_attention(q, k, v, 0.35, false, false);  // grad mode on: the batched path
  at::Tensor tiled;
  {
    at::NoGradGuard inference;
    tiled = scaled_attention(q, k, v, 0.35, false, false);
  }
  EXPECT_TRUE(at::equal(tiled, tiled_attention(q, k, v, 0.35, false)));
  EXPECT_TRUE(sd::test::close_rel_max(tiled, batched, 1e-5));  // float32, different summation order
}

TEST(Norms, Bf16RunsInFloat32AndFloat32IsLibTorchsUpToSummationOrder) {
  torch::nn::GroupNorm gn(torch::nn::GroupNormOptions(4, 16).eps(1e-6));
  torch::nn::LayerNorm ln(torch::nn::LayerNormOptions({16}));
  {
    torch::NoGradGuard no_grad;
    gn->weight.normal_();
    gn->bias.normal_();
    ln->weight.normal_();
    ln->bias.normal_();
  }
  at::Tensor x = at::randn({2, 16, 5, 5}) * 4 + 3;
  at::Tensor tokens = at::randn({2, 7, 16}) * 4 + 3;
  // float32 takes models/fused_norm.h's kernels on an AVX2 CPU; float64 (the finite-difference tests') LibTorch's.
  EXPECT_TRUE(sd::test::close_rel_max(group_norm(gn, x), gn->forward(x), 1e-6));
  EXPECT_TRUE(sd::test::close_rel_max(layer_norm(ln, tokens), ln->forward(tokens), 1e-6));
  {
    torch::nn::GroupNorm gn64(torch::nn::GroupNormOptions(4, 16).eps(1e-6));
    torch::nn::LayerNorm ln64(torch::nn::LayerNormOptions({16}));
    gn64->to(at::kDouble);
    ln64->to(at::kDouble);
    EXPECT_TRUE(at::equal(group_norm(gn64, x.to(at::kDouble)), gn64->forward(x.to(at::kDouble))));
    EXPECT_TRUE(at::equal(layer_norm(ln64, tokens.to(at::kDouble)), ln64->forward(tokens.to(at::kDouble))));
  }
  const at::Tensor gn_ref = gn->forward(x.to(at::kBFloat16).to(at::kFloat));
  const at::Tensor ln_ref = ln->forward(tokens.to(at::kBFloat16).to(at::kFloat));
  gn->to(at::kBFloat16);
  ln->to(at::kBFloat16);
  at::Tensor y = group_norm(gn, x.to(at::kBFloat16));
  at::Tensor z = layer_norm(ln, tokens.to(at::kBFloat16));
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  EXPECT_EQ(z.scalar_type(), at::kBFloat16);
  // Only the bf16 rounding of weights and output separates the result from float32 math.
  EXPECT_LT(sd::test::rel_l2(y, gn_ref), 1e-2);
  EXPECT_LT(sd::test::rel_l2(z, ln_ref), 1e-2);
}

TEST(Downsample2D, PaddingZeroPadsRightAndBottomOnly) {
  torch::NoGradGuard no_grad;
  Downsample2D down(1, 1, 0);
  down->conv->weight.zero_();
  down->conv->bias.zero_();
  at::Tensor x = at::arange(16, at::kFloat).reshape({1, 1, 4, 4}) + 1;
  down->conv->weight[0][0][1][1] = 1.0;  // output (i, j) = input (2i+1, 2j+1)
  at::Tensor y = down->forward(x);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{1, 1, 2, 2}));
  EXPECT_TRUE(at::equal(y.flatten(), at::tensor({6.0f, 8.0f, 14.0f, 16.0f})));
  down->conv->weight[0][0][1][1] = 0.0;
  down->conv->weight[0][0][2][2] = 1.0;  // input (2i+2, 2j+2): beyond the right/bottom edge it reads the zero pad
  EXPECT_TRUE(at::equal(down->forward(x).flatten(), at::tensor({11.0f, 0.0f, 0.0f, 0.0f})));
  down->conv->weight[0][0][2][2] = 0.0;
  down->conv->weight[0][0][0][0] = 1.0;  // input (2i, 2j): no pad on the left/top
  EXPECT_TRUE(at::equal(down->forward(x).flatten(), at::tensor({1.0f, 3.0f, 9.0f, 11.0f})));
  // padding 1 (the UNet's) is symmetric: same-size stride-2 output with the centre tap at (2i, 2j).
  Downsample2D unet_down(1, 1, 1);
  unet_down->conv->weight.zero_();
  unet_down->conv->bias.zero_();
  unet_down->conv->weight[0][0][1][1] = 1.0;
  EXPECT_TRUE(at::equal(unet_down->forward(x).flatten(), at::tensor({1.0f, 3.0f, 9.0f, 11.0f})));
}

TEST(Upsample2D, NearestDoublingOrExplicitSize) {
  torch::NoGradGuard no_grad;
  Upsample2D up(1, 1);
  up->conv->weight.zero_();
  up->conv->bias.zero_();
  up->conv->weight[0][0][1][1] = 1.0;  // identity conv
  at::Tensor x = at::arange(4, at::kFloat).reshape({1, 1, 2, 2});
  EXPECT_TRUE(at::equal(up->forward(x)[0][0], at::tensor({0.0f, 0.0f, 1.0f, 1.0f, 0.0f, 0.0f, 1.0f, 1.0f, 2.0f, 2.0f,
                                                          3.0f, 3.0f, 2.0f, 2.0f, 3.0f, 3.0f})
                                                  .reshape({4, 4})));
  EXPECT_EQ(up->forward(x, std::vector<int64_t>{3, 5}).sizes(), (std::vector<int64_t>{1, 1, 3, 5}));
}

}  // namespace
}  // namespace sd::models
