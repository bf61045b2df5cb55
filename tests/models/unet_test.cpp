#include "models/unet/unet_2d_condition.h"

#include <ATen/ATen.h>

#include <set>
#include <torch/csrc/autograd/grad_mode.h>

#include "dist/gradient_reducer.h"
#include "model_test_util.h"
#include "models/weights.h"
#include "perf/op_profiler.h"

namespace sd::models {
namespace {

using sd::test::error_message;
using sd::test::fixtures;
using sd::test::golden;
using sd::test::matches_golden;
using sd::test::TempDir;

at::Tensor named_parameter(const torch::nn::Module& m, const std::string& name) {
  auto params = m.named_parameters(/*recurse=*/true);
  const at::Tensor* p = params.find(name);
  if (!p) throw std::runtime_error("no parameter " + name);
  return *p;
}

// C1: forward, MSE loss and gradients of tiny-sd{1,2}'s UNet against diffusers.
void check_unet_golden(const std::string& pipeline) {
  UNet2DConditionModel unet = load_unet(fixtures() / pipeline / "unet", at::kFloat);
  auto g = io::load_safetensors(golden(pipeline + "/unet.safetensors"));
  at::Tensor sample = g.at("input.sample").clone().requires_grad_(true);
  at::Tensor context = g.at("input.encoder_hidden_states").clone().requires_grad_(true);
  ASSERT_EQ(g.at("input.timestep").scalar_type(), at::kLong);

  at::Tensor out = unet->forward(sample, g.at("input.timestep"), context);
  EXPECT_TRUE(matches_golden(pipeline + " output", out, g.at("output"), 1e-4));
  at::Tensor loss = at::mse_loss(out, g.at("input.target"));
  EXPECT_TRUE(matches_golden(pipeline + " loss", loss.reshape({1}), g.at("loss"), 1e-4));
  loss.backward();
  EXPECT_TRUE(matches_golden(pipeline + " grad_sample", sample.grad(), g.at("grad_sample"), 1e-3));
  EXPECT_TRUE(matches_golden(pipeline + " grad_encoder_hidden_states", context.grad(),
                             g.at("grad_encoder_hidden_states"), 1e-3));
  int checked = 0;
  for (const auto& [key, expected] : g) {
    const std::string prefix = "grad_param.";
    if (key.rfind(prefix, 0) != 0) continue;
    const std::string name = key.substr(prefix.size());
    EXPECT_TRUE(matches_golden(pipeline + " " + key, named_parameter(*unet, name).grad(), expected, 1e-3));
    ++checked;
  }
  EXPECT_EQ(checked, 6);
}

TEST(UNetGolden, TinySd1MatchesDiffusers) { check_unet_golden("tiny-sd1"); }
TEST(UNetGolden, TinySd2LinearProjectionMatchesDiffusers) { check_unet_golden("tiny-sd2"); }

TEST(UNet, ScalarAndFloatTimestepsBroadcastLikeDiffusers) {
  torch::NoGradGuard no_grad;
  UNet2DConditionModel unet = load_unet(fixtures() / "tiny-sd1" / "unet");
  auto g = io::load_safetensors(golden("tiny-sd1/unet.safetensors"));
  at::Tensor sample = g.at("input.sample");
  at::Tensor context = g.at("input.encoder_hidden_states");
  at::Tensor per_item = unet->forward(sample, at::tensor({500, 500}, at::kLong), context);
  at::Tensor scalar = unet->forward(sample, at::scalar_tensor(500, at::kLong), context);
  at::Tensor one = unet->forward(sample, at::tensor({500}, at::kLong), context);
  at::Tensor as_float = unet->forward(sample, at::tensor({500.0f, 500.0f}), context);
  EXPECT_TRUE(at::equal(per_item, scalar));
  EXPECT_TRUE(at::equal(per_item, one));
  EXPECT_TRUE(at::equal(per_item, as_float));
  // and the timestep does matter
  at::Tensor other = unet->forward(sample, at::tensor({501, 500}, at::kLong), context);
  EXPECT_FALSE(at::equal(per_item.select(0, 0), other.select(0, 0)));
  EXPECT_TRUE(at::equal(per_item.select(0, 1), other.select(0, 1)));
  EXPECT_NE(error_message([&] { unet->forward(sample, at::tensor({1, 2, 3}), context); }), "");
}

TEST(UNet, TimestepEmbeddingIsFloat32SinusoidWithFlip) {
  // flip_sin_to_cos puts cos first; frequencies exp(-ln(10000) * i / (half - shift)).
  at::Tensor emb = timestep_embedding(at::tensor({0, 7}, at::kLong), 8, /*flip=*/true, /*shift=*/0);
  ASSERT_EQ(emb.scalar_type(), at::kFloat);
  ASSERT_EQ(emb.sizes(), (std::vector<int64_t>{2, 8}));
  for (int i = 0; i < 4; ++i) {
    double freq = std::exp(-std::log(10000.0) * i / 4.0);
    EXPECT_NEAR(emb[1][i].item<double>(), std::cos(7 * freq), 1e-6);
    EXPECT_NEAR(emb[1][4 + i].item<double>(), std::sin(7 * freq), 1e-6);
    EXPECT_EQ(emb[0][i].item<float>(), 1.0f);
  }
  at::Tensor shifted = timestep_embedding(at::tensor({7.0f}), 9, /*flip=*/false, /*shift=*/1);
  ASSERT_EQ(shifted.size(1), 9);  // odd dims get a zero pad column
  EXPECT_EQ(shifted[0][8].item<float>(), 0.0f);
  EXPECT_NEAR(shifted[0][1].item<double>(), std::sin(7 * std::exp(-std::log(10000.0) / 3.0)), 1e-6);
}

TEST(UNet, SizesNotDivisibleByTheUpscaleUseSkipSizes) {
  torch::NoGradGuard no_grad;
  UNet2DConditionModel unet = load_unet(fixtures() / "tiny-sd2" / "unet");
  at::Tensor out = unet->forward(at::randn({1, 4, 10, 14}), at::tensor({3}), at::randn({1, 77, 64}));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{1, 4, 10, 14}));
}

// ----- gradient checkpointing -----------------------------------------------------------------------------------

struct UNetRun {
  at::Tensor out, grad_sample, grad_context;
  std::map<std::string, at::Tensor> param_grads;
};

UNetRun run_with_grads(UNet2DConditionModel& unet, const io::TensorMap& g, bool params_trainable) {
  for (auto& p : unet->parameters()) {
    p.mutable_grad() = at::Tensor();
    p.requires_grad_(params_trainable);
  }
  at::Tensor sample = g.at("input.sample").clone().requires_grad_(true);
  at::Tensor context = g.at("input.encoder_hidden_states").clone().requires_grad_(true);
  UNetRun r;
  r.out = unet->forward(sample, g.at("input.timestep"), context);
  at::mse_loss(r.out, g.at("input.target")).backward();
  r.grad_sample = sample.grad();
  r.grad_context = context.grad();
  for (const auto& item : unet->named_parameters())
    if (item.value().grad().defined()) r.param_grads[item.key()] = item.value().grad().clone();
  return r;
}

void expect_same_gradients(const UNetRun& plain, const UNetRun& ckpt) {
  // The forward is the same computation; only gradient sums are grouped differently.
  EXPECT_TRUE(at::equal(plain.out, ckpt.out));
  EXPECT_TRUE(sd::test::close_rel_max(ckpt.grad_sample, plain.grad_sample, 1e-5));
  EXPECT_TRUE(sd::test::close_rel_max(ckpt.grad_context, plain.grad_context, 1e-5));
  ASSERT_EQ(plain.param_grads.size(), ckpt.param_grads.size());
  // Some gradients are exactly zero in exact arithmetic (a per-channel shift — conv1.bias, time_emb_proj — in
  // front of a GroupNorm with one channel per group, as in tiny block 0) and are pure rounding noise; those
  // are compared on the scale of the model's largest gradient instead of their own.
  double global = 0;
  for (const auto& [name, grad] : plain.param_grads) global = std::max(global, grad.abs().max().item<double>());
  double worst = 0;
  for (const auto& [name, grad] : plain.param_grads) {
    ASSERT_TRUE(ckpt.param_grads.count(name)) << name;
    const double err = (ckpt.param_grads.at(name) - grad).abs().max().item<double>();
    const double scale = std::max(grad.abs().max().item<double>(), 1e-2 * global);
    EXPECT_LE(err, 1e-5 * scale) << name << ": max|grad| " << grad.abs().max().item<double>();
    worst = std::max(worst, err / scale);
  }
  std::cout << "  [ratio] checkpointed vs plain parameter gradients, worst " << worst << "\n";
}

// The matmul and convolution FLOPs forward + backward ran, with `levels` resolution levels checkpointed.
int64_t flops_of_training_pass(UNet2DConditionModel& unet, const io::TensorMap& g, int levels, UNetRun& run) {
  unet->set_checkpointed_levels(levels);
  perf::OpProfiler profiler(/*count_flops=*/true);
  run = run_with_grads(unet, g, true);
  return profiler.profile().matmul_flops;
}

TEST(UNetCheckpointing, EachLevelRecomputesItsBlocksAndGradientsEqualThePlainBackward) {
  for (const std::string pipeline : {"tiny-sd1", "tiny-sd2"}) {
    SCOPED_TRACE(pipeline);
    UNet2DConditionModel unet = load_unet(fixtures() / pipeline / "unet");
    auto g = io::load_safetensors(golden(pipeline + "/unet.safetensors"));
    ASSERT_GE(unet->resolution_levels(), 2);
    UNetRun plain, ckpt;
    const int64_t plain_flops = flops_of_training_pass(unet, g, 0, plain);
    EXPECT_EQ(plain.param_grads.size(), unet->parameters().size());
    int64_t forward_flops = 0;
    {
      torch::NoGradGuard no_grad;
      perf::OpProfiler profiler(/*count_flops=*/true);
      unet->forward(g.at("input.sample"), g.at("input.timestep"), g.at("input.encoder_hidden_states"));
      forward_flops = profiler.profile().matmul_flops;
    }
    // Each further level recomputes more blocks in backward; all of them recompute the whole forward but
    // conv_in, conv_out and the time embedding (the blocks' inputs and what follows them).
    int64_t previous = plain_flops;
    for (int levels = 1; levels <= unet->resolution_levels(); ++levels) {
      SCOPED_TRACE(levels);
      const int64_t flops = flops_of_training_pass(unet, g, levels, ckpt);
      EXPECT_GT(flops, previous);
      previous = flops;
      expect_same_gradients(plain, ckpt);
    }
    EXPECT_LT(previous - plain_flops, forward_flops);
    EXPECT_GT(previous - plain_flops, 0.8 * forward_flops);
    // The checkpointed run still matches diffusers.
    EXPECT_TRUE(matches_golden(pipeline + " checkpointed grad_sample", ckpt.grad_sample, g.at("grad_sample"), 1e-3));
  }
}

TEST(UNetCheckpointing, MemoryOptionsPickTheLevels) {
  UNet2DConditionModel unet = load_unet(fixtures() / "tiny-sd1" / "unet");
  UNetMemoryOptions o;
  unet->set_memory_options(o);
  EXPECT_EQ(unet->checkpointed_levels(), 0);
  o.gradient_checkpointing = true;  // diffusers' flag: every block
  unet->set_memory_options(o);
  EXPECT_EQ(unet->checkpointed_levels(), unet->resolution_levels());
  o.gradient_checkpointing_levels = 1;  // with or without the flag: the highest resolution only
  unet->set_memory_options(o);
  EXPECT_EQ(unet->checkpointed_levels(), 1);
  o.gradient_checkpointing = false;
  unet->set_memory_options(o);
  EXPECT_EQ(unet->checkpointed_levels(), 1);
  o.gradient_checkpointing_levels = 4;
  EXPECT_EQ(error_message([&] { unet->set_memory_options(o); }),
            "gradient checkpointing of 4 resolution levels: this UNet has 3 (its down blocks)");
}

TEST(UNetCheckpointing, FrozenUNetStillPassesGradientsToItsInputs) {
  // Textual inversion: the UNet is frozen, the gradient flows to encoder_hidden_states only.
  UNet2DConditionModel unet = load_unet(fixtures() / "tiny-sd1" / "unet");
  auto g = io::load_safetensors(golden("tiny-sd1/unet.safetensors"));
  UNetRun plain = run_with_grads(unet, g, false);
  unet->set_checkpointed_levels(unet->resolution_levels());
  UNetRun ckpt = run_with_grads(unet, g, false);
  EXPECT_TRUE(plain.param_grads.empty());
  EXPECT_TRUE(ckpt.param_grads.empty());
  expect_same_gradients(plain, ckpt);
  EXPECT_TRUE(matches_golden("frozen checkpointed grad_encoder_hidden_states", ckpt.grad_context,
                             g.at("grad_encoder_hidden_states"), 1e-3));
}

// ----- bfloat16 -------------------------------------------------------------------------------------------------

TEST(UNetBf16, RunsWithAllWeightsInBf16CloseToFloat32) {
  for (const std::string pipeline : {"tiny-sd1", "tiny-sd2"}) {
    SCOPED_TRACE(pipeline);
    auto g2 = io::load_safetensors(golden(pipeline + "/unet.safetensors"));
    UNet2DConditionModel unet = load_unet(fixtures() / pipeline / "unet", at::kBFloat16);
    for (const auto& p : unet->parameters()) ASSERT_EQ(p.scalar_type(), at::kBFloat16);
    at::Tensor sample = g2.at("input.sample").to(at::kBFloat16).requires_grad_(true);
    at::Tensor context = g2.at("input.encoder_hidden_states").to(at::kBFloat16);
    at::Tensor out = unet->forward(sample, g2.at("input.timestep"), context);
    ASSERT_EQ(out.scalar_type(), at::kBFloat16);
    const double err = sd::test::rel_l2(out, g2.at("output"));
    std::cout << "  [ratio] " << pipeline << " bf16 output rel_l2 vs diffusers float32 " << err << "\n";
    EXPECT_LT(err, sd::test::bf16_tolerance(5e-2));
    // Training runs backward through the bf16 model (the loss is taken in float32, as diffusers' scripts do).
    at::mse_loss(out.to(at::kFloat), g2.at("input.target")).backward();
    ASSERT_TRUE(sample.grad().defined());
    EXPECT_EQ(sample.grad().scalar_type(), at::kBFloat16);
    EXPECT_LT(sd::test::rel_l2(sample.grad(), g2.at("grad_sample")), sd::test::bf16_tolerance(1e-1));
    EXPECT_TRUE(at::isfinite(named_parameter(*unet, "conv_in.weight").grad()).all().item<bool>());
  }
}

// ----- loading --------------------------------------------------------------------------------------------------

TEST(UNetLoading, HalfAndBf16FilesLoadIntoFloat32AndBf16Models) {
  const auto src = io::load_safetensors(fixtures() / "tiny-sd1" / "unet" / "diffusion_pytorch_model.safetensors");
  for (auto stored : {at::kHalf, at::kBFloat16}) {
    TempDir tmp;
    sd::test::write_edited_component(tmp.path(), "tiny-sd1", "unet", [&](io::TensorMap& w) {
      for (auto& [name, t] : w) t = t.to(stored);
    });
    for (auto target : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(std::string(c10::toString(stored)) + " -> " + c10::toString(target));
      UNet2DConditionModel unet = load_unet(tmp.path(), target);
      auto weights = named_weights(*unet);
      ASSERT_EQ(weights.size(), src.size());
      for (const auto& [name, value] : weights) {
        ASSERT_EQ(value.scalar_type(), target) << name;
        ASSERT_TRUE(at::equal(value, src.at(name).to(stored).to(target))) << name;
      }
    }
  }
}

TEST(UNetLoading, WrongShapeOrMissingKeyIsOneLineNamingFileAndKey) {
  TempDir tmp;
  const auto dir = tmp.path() / "unet";
  sd::test::write_edited_component(dir, "tiny-sd1", "unet", [](io::TensorMap& w) {
    w["conv_in.weight"] = at::zeros({32, 4, 1, 1});
  });
  std::string msg = error_message([&] { load_unet(dir); });
  EXPECT_NE(msg.find((dir / "diffusion_pytorch_model.safetensors").string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("conv_in.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[32, 4, 1, 1]"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;

  sd::test::write_edited_component(dir, "tiny-sd1", "unet", [](io::TensorMap& w) {
    w.erase("mid_block.attentions.0.transformer_blocks.0.attn2.to_k.weight");
  });
  msg = error_message([&] { load_unet(dir); });
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mid_block.attentions.0.transformer_blocks.0.attn2.to_k.weight"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;

  // The SD-2 weights do not fit the SD-1 config (Linear vs 1×1-conv projections, cross-attention width).
  std::filesystem::copy_file(fixtures() / "tiny-sd2" / "unet" / "diffusion_pytorch_model.safetensors",
                             dir / "diffusion_pytorch_model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  msg = error_message([&] { load_unet(dir); });
  EXPECT_NE(msg.find("proj_in.weight"), std::string::npos) << msg;

  std::filesystem::remove(dir / "diffusion_pytorch_model.safetensors");
  msg = error_message([&] { load_unet(dir); });
  EXPECT_NE(msg.find((dir / "diffusion_pytorch_model.safetensors").string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;

  std::filesystem::remove(dir / "config.json");
  msg = error_message([&] { load_unet(dir); });
  EXPECT_NE(msg.find((dir / "config.json").string()), std::string::npos) << msg;
}

TEST(UNetLoading, RejectsInputsThatDoNotFit) {
  UNet2DConditionModel unet = load_unet(fixtures() / "tiny-sd1" / "unet");
  torch::NoGradGuard no_grad;
  auto t = at::tensor({1, 2});
  EXPECT_NE(error_message([&] { unet->forward(at::zeros({2, 3, 8, 8}), t, at::zeros({2, 77, 32})); }), "");
  EXPECT_NE(error_message([&] { unet->forward(at::zeros({2, 4, 8, 8}), t, at::zeros({2, 77, 64})); }), "");
  EXPECT_NE(error_message([&] { unet->forward(at::zeros({2, 4, 8, 8}, at::kDouble), t, at::zeros({2, 77, 32})); }), "");
  EXPECT_NE(error_message([&] {
              unet->forward(at::zeros({2, 4, 8, 8}), t, at::zeros({2, 77, 32}, at::kBFloat16));
            }),
            "");
}

// ----- parameter order for gradient buckets ---------------------------------------------------------------------

// Peak bytes of gradient buffers a sharded reducer holds for one backward of the tiny UNet when its buckets (of
// about 1/20 of the model each) take the parameters in `order`: buckets whose gradients are complete wait while an
// earlier bucket is not.
int64_t peak_gradient_buffers(UNet2DConditionModel& unet, const std::vector<at::Tensor>& order, int64_t* cap_bytes) {
  std::vector<int64_t> numels;
  int64_t total = 0;
  for (const at::Tensor& p : order) {
    numels.push_back(p.numel());
    total += p.numel();
  }
  const dist::BucketLayout layout(numels, total / 20, 1, /*sharded=*/true);
  *cap_bytes = 4 * (total / 20);
  dist::GradientReducer reducer(std::make_shared<dist::LocalCommunicator>(), order, layout);
  auto g = io::load_safetensors(golden("tiny-sd1/unet.safetensors"));
  // Not the step's last micro-batch: a lone rank's only one would keep autograd's gradients and fill no bucket.
  reducer.begin_micro_batch(true, false);
  at::mse_loss(unet->forward(g.at("input.sample"), g.at("input.timestep"), g.at("input.encoder_hidden_states")),
               g.at("input.target"))
      .backward();
  reducer.end_micro_batch();
  reducer.finish();
  return reducer.peak_buffered_bytes();
}

TEST(UNetParameters, ForwardOrderBucketsFillInTheOrderBackwardProducesGradients) {
  UNet2DConditionModel unet = load_unet(fixtures() / "tiny-sd1" / "unet");
  std::vector<at::Tensor> forward_order;
  std::set<std::string> names;
  for (const auto& [name, p] : unet->named_parameters_in_forward_order()) {
    forward_order.push_back(p);
    names.insert(name);
  }
  ASSERT_EQ(forward_order.size(), unet->parameters().size());
  ASSERT_EQ(names.size(), forward_order.size()) << "every parameter once";
  EXPECT_EQ(unet->named_parameters_in_forward_order().front().first, "time_embedding.linear_1.weight");
  EXPECT_EQ(unet->named_parameters_in_forward_order().back().first, "conv_out.bias");

  int64_t cap_bytes = 0;
  const int64_t in_forward_order = peak_gradient_buffers(unet, forward_order, &cap_bytes);
  const int64_t in_registration_order = peak_gradient_buffers(unet, unet->parameters(), &cap_bytes);
  std::cout << "  [bytes] peak gradient buffers: forward order " << in_forward_order << ", registration order "
            << in_registration_order << ", bucket cap " << cap_bytes << "\n";
  // The bucket being filled, at most two travelling, and what one layer's out-of-order gradients add.
  EXPECT_LE(in_forward_order, 4 * cap_bytes);
  EXPECT_LT(in_forward_order, in_registration_order);
}

// ----- parameter counts -----------------------------------------------------------------------------------------

TEST(UNetParameters, CountFromConfigMatchesBuiltModules) {
  std::vector<UNetConfig> configs;
  for (const std::string pipeline : {"tiny-sd1", "tiny-sd2"})
    configs.push_back(UNetConfig::load((fixtures() / pipeline / "unet" / "config.json").string()));
  // Variants exercising the per-block forms and optional parts.
  UNetConfig v = configs[0];
  v.layers_per_block = PerBlockInt::list({1, 2, 1});
  v.transformer_layers_per_block = PerBlockInt::list({2, 1, 1});
  v.cross_attention_dim = PerBlockInt::list({32, 48, 16});
  v.attention_head_dim = PerBlockInt::list({2, 4, 8});
  v.time_embedding_dim = 72;
  v.conv_in_kernel = 1;
  v.conv_out_kernel = 5;
  v.norm_num_groups = 16;
  v.in_channels = 9;
  configs.push_back(v);
  v = configs[1];
  v.mid_block_type = std::nullopt;
  v.down_block_types = {"DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"};
  v.up_block_types = {"CrossAttnUpBlock2D", "UpBlock2D", "CrossAttnUpBlock2D"};
  v.block_out_channels = {32, 64, 96};
  configs.push_back(v);
  for (const auto& c : configs) {
    UNet2DConditionModel unet(c);
    EXPECT_EQ(count_parameters(c), parameter_count(*unet));
  }
}

TEST(UNetParameters, RealStableDiffusionCountsAreExact) {
  EXPECT_EQ(count_parameters(UNetConfig::sd15()), 859520964);
  EXPECT_EQ(count_parameters(UNetConfig::sd2_base()), 865910724);
  EXPECT_EQ(count_parameters(UNetConfig::sd2()), 865910724);
}

}  // namespace
}  // namespace sd::models
