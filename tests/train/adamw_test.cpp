#include "train/adamw.h"

#include <torch/optim/adamw.h>

#include "test_util.h"

namespace sd::train {
namespace {

TEST(AdamW, BitIdenticalToLibTorchsAdamW) {
  at::manual_seed(0);
  at::Tensor a = at::randn({3, 5}).requires_grad_(true);
  at::Tensor b = a.detach().clone().requires_grad_(true);
  AdamW ours({a}, AdamWOptions{0.9, 0.99, 1e-6, 0.05});
  torch::optim::AdamW theirs({b}, torch::optim::AdamWOptions(1e-2).betas({0.9, 0.99}).eps(1e-6).weight_decay(0.05));
  for (int i = 0; i < 5; ++i) {
    at::Tensor g = at::randn({3, 5});
    a.mutable_grad() = g.clone();
    b.mutable_grad() = g.clone();
    ours.step(1e-2);
    theirs.step();
    ASSERT_TRUE(at::equal(a, b)) << i;
  }
}

TEST(AdamW, StateRoundTripContinuesIdentically) {
  at::Tensor a = at::randn({4}).requires_grad_(true);
  AdamW first({a}, {});
  a.mutable_grad() = at::randn({4});
  first.step(1e-3);
  at::Tensor b = a.detach().clone().requires_grad_(true);
  AdamW second({b}, {});
  second.load_state(first.state(), "test");
  at::Tensor g = at::randn({4});
  a.mutable_grad() = g.clone();
  b.mutable_grad() = g.clone();
  first.step(1e-3);
  second.step(1e-3);
  EXPECT_TRUE(at::equal(a, b));
}

}  // namespace
}  // namespace sd::train
