// One optimizer step of TrainableParameters against plain autograd and AdamW by hand, in float32 and in bf16 compute
// (PrecisionPolicy given directly, so the bf16 path runs on every CPU, whatever --mixed_precision would pick), for a
// lone rank's single micro-batch (autograd's gradients kept as they are) and for two micro-batches (float32 buckets).
#include <gtest/gtest.h>

#include "train/trainable_parameters.h"

namespace sd::train {
namespace {

// Shapes over several buckets at a 64-byte cap, some sharing one.
const std::vector<std::vector<int64_t>> kShapes = {{5, 7}, {7}, {3}, {40}, {2, 2}};

std::vector<at::Tensor> starting_weights() {
  at::manual_seed(5);
  std::vector<at::Tensor> weights;
  for (const auto& shape : kShapes) weights.push_back(at::randn(shape));
  return weights;
}

// Micro-batch m's loss over the weights the model reads: its gradient is t_m + w, rounded in the compute dtype.
at::Tensor loss_of(const std::vector<at::Tensor>& weights, int m) {
  at::Tensor loss;
  for (size_t i = 0; i < weights.size(); ++i) {
    const at::Tensor target = at::full(weights[i].sizes(), 0.25 * (m + 1) + 0.1 * i, weights[i].options());
    const at::Tensor term = (weights[i] * target).sum() + 0.5 * weights[i].pow(2).sum();
    loss = loss.defined() ? loss + term.to(at::kFloat) : term.to(at::kFloat);
  }
  return loss;
}

struct Expected {
  std::vector<at::Tensor> gradients, masters;  // float32: the mean gradient AdamW uses, the weights after the step
};

// Plain autograd on leaves in the compute dtype, the micro-batches' gradients summed in float32 and averaged, then
// AdamW on float32 copies of the weights.
Expected by_hand(at::ScalarType compute, int micro_batches, double lr) {
  const std::vector<at::Tensor> start = starting_weights();
  std::vector<at::Tensor> leaves, sums;
  for (const at::Tensor& w : start) {
    leaves.push_back(w.to(compute).requires_grad_());
    sums.push_back(at::zeros_like(w));
  }
  for (int m = 0; m < micro_batches; ++m) {
    for (auto& leaf : leaves) leaf.mutable_grad() = at::Tensor();
    loss_of(leaves, m).backward();
    for (size_t i = 0; i < leaves.size(); ++i) sums[i] += leaves[i].grad().to(at::kFloat);
  }
  Expected expected;
  for (const at::Tensor& sum : sums) expected.gradients.push_back(sum / micro_batches);
  for (const at::Tensor& w : start) expected.masters.push_back(w.clone());
  AdamW adam({});
  adam.step(expected.masters, expected.gradients, lr);
  return expected;
}

TEST(TrainableParametersStep, MatchesAutogradAndAdamWInFloat32AndBf16) {
  const double lr = 1e-2;
  for (const at::ScalarType compute : {at::kFloat, at::kBFloat16}) {
    for (const int micro_batches : {1, 2}) {
      const std::string where = fmt::format("{} compute, {} micro-batches", c10::toString(compute), micro_batches);
      TrainableOptions options;
      options.precision = {compute, compute, at::kFloat};
      options.bucket_cap_bytes = 64;
      std::vector<NamedParameter> named;
      const std::vector<at::Tensor> start = starting_weights();
      for (size_t i = 0; i < start.size(); ++i) named.push_back({fmt::format("p{}", i), start[i].requires_grad_()});
      TrainableParameters trained(std::move(named), options, std::make_shared<dist::LocalCommunicator>());

      std::vector<at::Tensor> weights;
      for (const NamedParameter& p : trained.parameters()) weights.push_back(p.tensor);
      for (int m = 0; m < micro_batches; ++m) trained.backward(loss_of(weights, m), m == 0, m + 1 == micro_batches);
      const double norm = trained.reduce_gradients(micro_batches, std::nullopt);

      const Expected expected = by_hand(compute, micro_batches, lr);
      double squares = 0;
      for (size_t i = 0; i < weights.size(); ++i) {
        EXPECT_EQ(weights[i].scalar_type(), compute) << where;
        EXPECT_TRUE(at::equal(trained.gradient(i), expected.gradients[i])) << where << ", gradient " << i;
        squares += expected.gradients[i].pow(2).sum().item<double>();
      }
      EXPECT_NEAR(norm, std::sqrt(squares), 1e-6 * std::sqrt(squares)) << where;

      trained.step(lr);
      const io::TensorMap masters = trained.gather(StateKind::kMaster);
      for (size_t i = 0; i < weights.size(); ++i) {
        EXPECT_TRUE(at::equal(masters.at(fmt::format("p{}", i)), expected.masters[i])) << where << ", master " << i;
        // The model reads the new masters rounded to the compute dtype.
        EXPECT_TRUE(at::equal(weights[i], expected.masters[i].to(compute))) << where << ", weights " << i;
      }
    }
  }
}

}  // namespace
}  // namespace sd::train
