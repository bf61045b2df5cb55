// The LoRA seam (models/lora.h): an adapted Linear / Conv2d adds scale · alpha/rank · up(down(x)), merging gives the
// same outputs through the merged weight, adapters are not weights of the model, and gradient checkpointing still
// trains them.
#include "models/lora.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include "core/error.h"
#include "model_test_util.h"
#include "models/unet/unet_2d_condition.h"
#include "models/weights.h"

namespace sd::models {
namespace {

using sd::test::close_rel_max;

LoraAdapter random_adapter(at::IntArrayRef weight, int64_t rank, double alpha, double scale) {
  const auto [down, up] = lora_adapter_shapes(weight, rank);
  return {at::randn(down, at::kDouble), at::randn(up, at::kDouble), alpha, scale};
}

TEST(LoraSeam, LinearAddsTheScaledLowRankPathAndMergesToTheSameOutput) {
  at::manual_seed(1);
  Linear layer(7, 5);
  layer->to(at::kDouble);
  const at::Tensor x = at::randn({3, 4, 7}, at::kDouble);
  const at::Tensor base = layer->forward(x);
  const LoraAdapter a = random_adapter(layer->weight.sizes(), 2, /*alpha=*/3, /*scale=*/0.7);
  const LoraAdapter b = random_adapter(layer->weight.sizes(), 3, /*alpha=*/3, /*scale=*/-0.5);
  layer->add_adapter(a, "a");
  layer->add_adapter(b, "b");
  // kohya's LoRAModule.forward: org + up(down(x)) * multiplier * alpha / rank, per adapter.
  const at::Tensor expected = base + at::matmul(at::matmul(x, a.down.t()), a.up.t()) * (0.7 * 3 / 2) +
                              at::matmul(at::matmul(x, b.down.t()), b.up.t()) * (-0.5 * 3 / 3);
  const at::Tensor adapted = layer->forward(x);
  EXPECT_TRUE(close_rel_max(adapted, expected, 1e-12));
  EXPECT_GT((adapted - base).abs().max().item<double>(), 0.1);

  layer->merge_adapters();
  EXPECT_TRUE(layer->adapters().empty());
  EXPECT_TRUE(close_rel_max(layer->forward(x), expected, 1e-12));
}

TEST(LoraSeam, ConvAdapterUsesTheLayersKernelStrideAndPadding) {
  at::manual_seed(2);
  Conv2d layer(torch::nn::Conv2dOptions(4, 6, 3).stride(2).padding(1));
  layer->to(at::kDouble);
  const at::Tensor x = at::randn({2, 4, 9, 9}, at::kDouble);
  const LoraAdapter a = random_adapter(layer->weight.sizes(), 2, /*alpha=*/1, /*scale=*/1.5);
  layer->add_adapter(a, "locon");
  // A kh x kw down conv then a 1x1 up conv is one conv with the weight up·down: what merging stores.
  const at::Tensor delta = at::mm(a.up.flatten(1), a.down.flatten(1)).view(layer->weight.sizes()) * (1.5 * 1 / 2);
  const at::Tensor expected = at::conv2d(x, layer->weight + delta, layer->bias, 2, 1);
  EXPECT_TRUE(close_rel_max(layer->forward(x), expected, 1e-12));
  const at::Tensor weight_before = layer->weight.detach().clone();
  layer->merge_adapters();
  EXPECT_TRUE(close_rel_max(layer->weight, weight_before + delta, 1e-12));
  EXPECT_TRUE(close_rel_max(layer->forward(x), expected, 1e-12));
}

TEST(LoraSeam, WrongShapesAreOneLineNamingTheAdapter) {
  Linear layer(7, 5);
  const std::string message = sd::test::error_message([&] {
    layer->add_adapter({at::zeros({4, 5}), at::zeros({5, 4}), 4, 1}, "lora.safetensors: attn1.to_q");
  });
  EXPECT_EQ(message,
            "lora.safetensors: attn1.to_q: LoRA down [4, 5] / up [5, 4] do not fit the layer's weight [5, 7] "
            "(expected down [4, 7], up [5, 4])");
  EXPECT_TRUE(layer->adapters().empty());
}

UNet2DConditionModel tiny_unet() { return load_unet(sd::test::fixtures() / "tiny-sd1" / "unet", at::kFloat); }

// Adapters on every to_q / to_k of the UNet, with non-zero up so they change the output.
std::vector<at::Tensor> adapt_attention(UNet2DConditionModel& unet) {
  std::vector<at::Tensor> tensors;
  for (auto& [path, host] : lora_hosts(*unet)) {
    if (path.size() < 4 || (path.substr(path.size() - 4) != "to_q" && path.substr(path.size() - 4) != "to_k")) continue;
    LoraAdapter a = random_adapter(host->base_weight_shape(), 2, 2, 1);
    a.down = (a.down.to(at::kFloat) * 0.1).requires_grad_(true);
    a.up = (a.up.to(at::kFloat) * 0.1).requires_grad_(true);
    host->add_adapter(a, path);
    tensors.insert(tensors.end(), {a.down, a.up});
  }
  return tensors;
}

TEST(LoraSeam, AdaptersAreNotWeightsOfTheModel) {
  UNet2DConditionModel unet = tiny_unet();
  const size_t before = named_weights(*unet).size();
  EXPECT_EQ(adapt_attention(unet).size(), 2u * 2 * 22);  // 11 transformer blocks x (attn1, attn2) x (to_q, to_k)
  EXPECT_EQ(named_weights(*unet).size(), before);
  EXPECT_EQ(adapter_tensors(*unet).size(), 88u);
}

TEST(LoraSeam, GradientCheckpointingGivesTheAdaptersTheSameGradients) {
  at::manual_seed(3);
  const at::Tensor sample = at::randn({1, 4, 16, 16}), context = at::randn({1, 77, 32});
  const at::Tensor timestep = at::tensor({500}, at::kLong);
  std::vector<std::vector<at::Tensor>> grads;
  for (bool checkpointing : {false, true}) {
    at::manual_seed(4);
    UNet2DConditionModel unet = tiny_unet();
    for (auto& p : unet->parameters()) p.set_requires_grad(false);
    const std::vector<at::Tensor> adapters = adapt_attention(unet);
    unet->set_checkpointed_levels(checkpointing ? unet->resolution_levels() : 0);
    unet->forward(sample, timestep, context).pow(2).mean().backward();
    grads.emplace_back();
    for (const auto& t : adapters) grads.back().push_back(t.grad());
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) {
    ASSERT_TRUE(grads[1][i].defined()) << i;
    EXPECT_TRUE(close_rel_max(grads[1][i], grads[0][i], 1e-5)) << i;
  }
}

// The layers draw LibTorch's default initialisation (PyTorch's too) in the same order: a model built from a seed is
// the model PyTorch builds from it.
TEST(Layers, InitialiseAsLibTorchsModulesFromTheSameSeed) {
  for (bool bias : {true, false}) {
    at::manual_seed(7);
    Linear ours(torch::nn::LinearOptions(6, 4).bias(bias));
    Conv2d ours_conv(torch::nn::Conv2dOptions(3, 5, 3).padding(1).bias(bias));
    const at::Tensor ours_next = at::rand({3});
    at::manual_seed(7);
    torch::nn::Linear theirs(torch::nn::LinearOptions(6, 4).bias(bias));
    torch::nn::Conv2d theirs_conv(torch::nn::Conv2dOptions(3, 5, 3).padding(1).bias(bias));
    EXPECT_TRUE(at::equal(ours->weight, theirs->weight));
    EXPECT_TRUE(at::equal(ours_conv->weight, theirs_conv->weight));
    EXPECT_EQ(ours->bias.defined(), bias);
    EXPECT_EQ(ours_conv->bias.defined(), bias);
    if (bias) {
      EXPECT_TRUE(at::equal(ours->bias, theirs->bias));
      EXPECT_TRUE(at::equal(ours_conv->bias, theirs_conv->bias));
    }
    EXPECT_TRUE(at::equal(ours_next, at::rand({3})));
    std::vector<std::string> names;
    for (const auto& p : ours->named_parameters()) names.push_back(p.key());
    const std::vector<std::string> expected =
        bias ? std::vector<std::string>{"weight", "bias"} : std::vector<std::string>{"weight"};
    EXPECT_EQ(names, expected);
  }
}

TEST(Layers, BuiltUninitializedWhileTheScopeLivesDrawingNothing) {
  at::manual_seed(3);
  const at::Tensor expected_next = at::rand({4});
  at::manual_seed(3);
  {
    ScopedUninitializedLayers weights_read_next;
    { ScopedUninitializedLayers nested; }
    Linear layer(torch::nn::LinearOptions(6, 4));  // still inside the outer scope
    Conv2d conv(torch::nn::Conv2dOptions(3, 5, 1));
    ScopedDefaultDtype bf16(at::kBFloat16);
    Linear bf16_layer(6, 4);
    EXPECT_EQ(bf16_layer->weight.scalar_type(), at::kBFloat16);
    EXPECT_EQ(conv->weight.sizes(), at::IntArrayRef({5, 3, 1, 1}));
    EXPECT_EQ(layer->bias.sizes(), at::IntArrayRef({4}));
  }
  EXPECT_TRUE(at::equal(at::rand({4}), expected_next));
  // After the scope, layers initialise again.
  at::manual_seed(3);
  Linear after(6, 4);
  at::manual_seed(3);
  torch::nn::Linear theirs(6, 4);
  EXPECT_TRUE(at::equal(after->weight, theirs->weight));
}

TEST(Layers, ConvolutionsOtherThanTheModelsAreRefused) {
  for (const auto& options :
       {torch::nn::Conv2dOptions(3, 5, 3).groups(3), torch::nn::Conv2dOptions(3, 5, 3).dilation(2),
        torch::nn::Conv2dOptions(3, 5, 3).padding_mode(torch::kReflect),
        torch::nn::Conv2dOptions(3, 5, 3).padding(torch::kSame)})
    EXPECT_THROW(Conv2d{options}, sd::Error);
}

}  // namespace
}  // namespace sd::models
