#include "train/adamw.h"

#include <torch/optim/adamw.h>

#include "core/error.h"
#include "test_util.h"

namespace sd::train {
namespace {

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

TEST(AdamW, RefusesWhatTorchRefuses) {
  EXPECT_THROW(AdamW(AdamWOptions{1.0, 0.999, 1e-8, 0.01}), Error);
  EXPECT_THROW(AdamW(AdamWOptions{0.9, -0.1, 1e-8, 0.01}), Error);
  EXPECT_THROW(AdamW(AdamWOptions{0.9, 0.999, -1e-8, 0.01}), Error);
  EXPECT_THROW(AdamW(AdamWOptions{0.9, 0.999, 1e-8, -0.01}), Error);
}

}  // namespace
}  // namespace sd::train
