#include "train/adamw.h"

#include <torch/optim/adamw.h>

#include "core/error.h"
#include "test_util.h"

namespace sd::train {
namespace {

// The pass also writes `copy` (bf16) and, if given, moves `shadow` (float32) by an EMA rate of 0.25.
AdamWFollowers rounded_into(const at::Tensor& copy, const at::Tensor& shadow = {}) {
  AdamWFollowers followers;
  followers.rounded_copies = {copy};
  if (shadow.defined()) {
    followers.ema_shadows = {shadow};
    followers.ema_one_minus_decay = 0.25f;
  }
  return followers;
}

// The fused pass rounds like LibTorch's op-by-op AdamW except where LibTorch's vector kernels fuse a multiply-add
// (one rounding instead of two): within a few float32 ulps after several steps.
TEST(AdamW, MatchesLibTorchsAdamWToTheLastBits) {
  at::manual_seed(0);
  at::Tensor a = at::randn({3, 5});
  at::Tensor b = a.clone().requires_grad_(true);
  AdamW ours(AdamWOptions{0.9, 0.99, 1e-6, 0.05});
  torch::optim::AdamW theirs({b}, torch::optim::AdamWOptions(1e-2).betas({0.9, 0.99}).eps(1e-6).weight_decay(0.05));
  for (int i = 0; i < 5; ++i) {
    at::Tensor g = at::randn({3, 5});
    b.mutable_grad() = g.clone();
    ours.step({a}, {g}, 1e-2);
    theirs.step();
    ASSERT_TRUE(sd::test::close_rel_max(a, b.detach(), 1e-6)) << i;
  }
  EXPECT_EQ(ours.steps(), 5);
}

TEST(AdamW, StateRoundTripContinuesIdentically) {
  at::Tensor a = at::randn({4});
  AdamW first({});
  first.step({a}, {at::randn({4})}, 1e-3);
  at::Tensor b = a.clone();
  AdamW second({});
  second.set_state({first.exp_avg()[0].clone()}, {first.exp_avg_sq()[0].clone()}, first.steps());
  at::Tensor g = at::randn({4});
  first.step({a}, {g}, 1e-3);
  second.step({b}, {g}, 1e-3);
  EXPECT_TRUE(at::equal(a, b));
}

// A bf16 gradient is read exactly (the float32 path with the same values gives the same bits), and the bf16 copy
// written in the same pass is what .to(bf16) makes of the new weights. Sizes cover several threads' chunks, the
// vector loop and its masked tail.
TEST(AdamW, Bf16GradientsAndTheRoundedCopyMatchTheFloat32Path) {
  at::manual_seed(0);
  for (const int64_t n : {int64_t{13}, int64_t{3 << 16} + 5}) {
    at::Tensor a = at::randn({n}), b = a.clone();
    at::Tensor copy = at::zeros({n}, at::kBFloat16);
    AdamW via_float({}), via_bf16({});
    for (int i = 0; i < 3; ++i) {
      const at::Tensor g = at::randn({n}).to(at::kBFloat16);
      via_float.step({a}, {g.to(at::kFloat)}, 1e-2, 0.5);
      via_bf16.step({b}, {g}, 1e-2, 0.5, rounded_into(copy));
      ASSERT_TRUE(at::equal(a, b)) << n << " step " << i;
      ASSERT_TRUE(at::equal(copy, a.to(at::kBFloat16))) << n << " step " << i;
    }
    EXPECT_TRUE(at::equal(via_float.exp_avg()[0], via_bf16.exp_avg()[0]));
    EXPECT_TRUE(at::equal(via_float.exp_avg_sq()[0], via_bf16.exp_avg_sq()[0]));
  }
}

// Every value takes the same vector arithmetic at either vector width (and in a range's masked tail): the bits agree
// across widths, bf16 copy and EMA included.
TEST(AdamW, TheSameBitsAtEveryVectorWidth) {
  if (test::vector_widths().size() < 2) GTEST_SKIP() << "this CPU runs one vector width";
  at::manual_seed(4);
  const int64_t n = (int64_t{1} << 16) + 13;
  const at::Tensor start = at::randn({n});
  std::vector<at::Tensor> results;
  for (const int bits : test::vector_widths()) {
    const test::VectorWidth width(bits);
    at::manual_seed(5);
    at::Tensor p = start.clone(), copy = at::zeros({n}, at::kBFloat16), shadow = start.clone();
    AdamW adam({});
    for (int i = 0; i < 3; ++i)
      adam.step({p}, {at::randn({n}).to(at::kBFloat16)}, 1e-2, 0.5, rounded_into(copy, shadow));
    for (const at::Tensor& t : {p, copy.to(at::kFloat), shadow, adam.exp_avg()[0], adam.exp_avg_sq()[0]})
      results.push_back(t);
  }
  for (size_t i = 5; i < results.size(); ++i) EXPECT_TRUE(at::equal(results[i], results[i - 5])) << i;
}

// A NaN weight's bf16 copy is the NaN c10::BFloat16 makes, 0x7FC0, in the vector loop and the tail alike, whatever
// the NaN's sign and payload (rounding 0x7FFFFFFF's bits as a number would carry into the sign and give -0).
TEST(AdamW, ANanWeightsCopyIsTheCanonicalBf16Nan) {
  for (const int bits : test::vector_widths()) {
    const test::VectorWidth width(bits);
    at::Tensor p = at::ones({21}), copy = at::zeros({21}, at::kBFloat16);
    at::Tensor g_bits = at::full({21}, 0x3F800000, at::kInt);  // 1.0f
    g_bits[2] = 0x7FFFFFFF;
    g_bits[20] = static_cast<int32_t>(0xFFC00000u);
    AdamW({}).step({p}, {g_bits.view(at::kFloat)}, 1e-2, 1.0, rounded_into(copy));
    const at::Tensor copy_bits = copy.view(at::kShort);
    for (const int64_t i : {2, 20}) {
      EXPECT_TRUE(std::isnan(p[i].item<float>())) << bits << " " << i;
      EXPECT_EQ(copy_bits[i].item<int16_t>(), 0x7FC0) << bits << " " << i;
    }
    EXPECT_TRUE(at::equal(copy.narrow(0, 3, 17), p.narrow(0, 3, 17).to(at::kBFloat16))) << bits;
  }
}

// The EMA moved in AdamW's pass is torch's shadow.sub_((1 - decay) * (shadow - param)) on the new parameters, to
// the bit (two roundings, no fused multiply-add), in the vector loop and its masked tail, float32 and bf16
// gradients alike.
TEST(AdamW, TheEmaInThePassIsTorchsUpdateOfTheNewParameters) {
  at::manual_seed(3);
  for (const auto dtype : {at::kFloat, at::kBFloat16})
    for (const int64_t n : {int64_t{13}, int64_t{2 << 16} + 5}) {
      at::Tensor p = at::randn({n}), shadow = p.clone();
      AdamW adam({});
      for (int i = 0; i < 3; ++i) {
        const float one_minus_decay = i == 0 ? 1.0f : 0.1f / static_cast<float>(i + 1);
        const at::Tensor expected_from = shadow.clone();
        AdamWFollowers followers;
        followers.ema_shadows = {shadow};
        followers.ema_one_minus_decay = one_minus_decay;
        adam.step({p}, {at::randn({n}).to(dtype)}, 1e-2, 1.0, followers);
        const at::Tensor expected = expected_from.sub((expected_from - p) * one_minus_decay);
        ASSERT_TRUE(at::equal(shadow, expected)) << dtype << " " << n << " step " << i;
      }
    }
}

TEST(AdamW, RefusesAnEmaShadowThatIsNotFloat32OfTheParametersSize) {
  AdamW adam({});
  const at::Tensor p = at::zeros({4}), g = at::ones({4});
  for (const at::Tensor& bad : {at::zeros({4}, at::kBFloat16), at::zeros({5}), at::zeros({8}).slice(0, 0, 8, 2)}) {
    AdamWFollowers followers;
    followers.ema_shadows = {bad};
    EXPECT_THROW(adam.step({p}, {g}, 1e-3, 1.0, followers), Error);
  }
  EXPECT_EQ(adam.steps(), 0);
}

TEST(AdamW, RefusesACopyThatIsNotBf16OfTheParametersSize) {
  AdamW adam({});
  const at::Tensor p = at::zeros({4}), g = at::ones({4});
  EXPECT_THROW(adam.step({p}, {g}, 1e-3, 1.0, rounded_into(at::zeros({4}))), Error);
  EXPECT_THROW(adam.step({p}, {g}, 1e-3, 1.0, rounded_into(at::zeros({3}, at::kBFloat16))), Error);
  EXPECT_THROW(adam.step({p}, {g.to(at::kDouble)}, 1e-3), Error);
}

// A gradient in pieces (a lone rank's per-parameter gradients over a bucket, mixed dtypes) updates each element as
// the whole gradient would, bf16 copy and EMA included.
TEST(AdamW, AGradientInPiecesIsTheWholeGradient) {
  at::manual_seed(2);
  const int64_t n = (int64_t{2} << 16) + 9;
  at::Tensor a = at::randn({n}), b = a.clone();
  at::Tensor copy_a = at::zeros({n}, at::kBFloat16), copy_b = copy_a.clone();
  at::Tensor ema_a = a.clone(), ema_b = a.clone();
  AdamW whole({}), in_pieces({});
  for (int i = 0; i < 3; ++i) {
    const at::Tensor g = at::randn({n}).to(at::kBFloat16).to(at::kFloat);
    whole.step({a}, {g}, 1e-2, 0.5, rounded_into(copy_a, ema_a));
    const FlatPieces pieces = {
        {0, g.narrow(0, 0, 7)},
        {7, g.narrow(0, 7, int64_t{1} << 16).to(at::kBFloat16)},
        {7 + (int64_t{1} << 16), g.narrow(0, 7 + (int64_t{1} << 16), n - 7 - (int64_t{1} << 16))}};
    in_pieces.step({b}, std::vector<FlatPieces>{pieces}, 1e-2, 0.5, rounded_into(copy_b, ema_b));
    ASSERT_TRUE(at::equal(a, b)) << "step " << i;
    ASSERT_TRUE(at::equal(copy_a, copy_b)) << "step " << i;
    ASSERT_TRUE(at::equal(ema_a, ema_b)) << "step " << i;
  }
}

// Pieces must cover the parameter in order, each element once; a bad set changes nothing.
TEST(AdamW, RefusesPiecesThatDoNotCoverTheParameter) {
  AdamW adam({});
  const at::Tensor p = at::zeros({6}), g = at::ones({6});
  const std::vector<FlatPieces> bad = {{{0, g.narrow(0, 0, 3)}},
                                       {{0, g.narrow(0, 0, 3)}, {4, g.narrow(0, 4, 2)}},
                                       {{0, g.narrow(0, 0, 4)}, {3, g.narrow(0, 3, 3)}},
                                       {{3, g.narrow(0, 3, 3)}, {0, g.narrow(0, 0, 3)}}};
  for (const FlatPieces& pieces : bad) {
    EXPECT_THROW(adam.step({p}, std::vector<FlatPieces>{pieces}, 1e-3), Error);
    EXPECT_EQ(adam.steps(), 0);
    EXPECT_TRUE(at::equal(p, at::zeros({6})));
  }
}

TEST(AdamW, RefusesWhatTorchRefuses) {
  EXPECT_THROW(AdamW(AdamWOptions{1.0, 0.999, 1e-8, 0.01}), Error);
  EXPECT_THROW(AdamW(AdamWOptions{0.9, -0.1, 1e-8, 0.01}), Error);
  EXPECT_THROW(AdamW(AdamWOptions{0.9, 0.999, -1e-8, 0.01}), Error);
  EXPECT_THROW(AdamW(AdamWOptions{0.9, 0.999, 1e-8, -0.01}), Error);
}

// With epsilon 0 an element whose gradient has always been 0 would update by 0/0.
TEST(AdamW, RefusesAZeroEpsilon) {
  try {
    AdamW(AdamWOptions{0.9, 0.999, 0.0, 0.01});
    ADD_FAILURE() << "epsilon 0 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "--adam_epsilon must be a finite number > 0 (0 divides 0 by 0 where a gradient is 0), got 0");
  }
}

}  // namespace
}  // namespace sd::train
