// Replays the reference's full-UNet training steps (fixtures golden C7) through the training engine's parts:
// DenoisingLoss for the loss, TrainableParameters for gradients, AdamW and EMA, the diffusers lr schedule.
#include <gtest/gtest.h>

#include "dist/communicator.h"
#include "io/safetensors.h"
#include "models/unet/unet_2d_condition.h"
#include "schedulers/ddpm.h"
#include "schedulers/scheduler_config.h"
#include "test_util.h"
#include "train/lr_schedule.h"
#include "train/tasks/denoising_loss.h"
#include "train/trainable_parameters.h"

namespace sd::train {
namespace {

using sd::test::close_rel_max;

struct Replayed {
  io::TensorMap initial, after, ema;
  std::vector<double> losses, lrs, decays;
  std::vector<at::Tensor> grad_conv_in, grad_conv_out_bias;
};

// The reference's three steps on tiny-sd1: AdamW(1e-4, wd 0.01), linear schedule (2 warm-up of 10), no clipping.
Replayed replay(const io::TensorMap& g, EmaOptions ema) {
  const auto dir = sd::test::fixtures() / "tiny-sd1";
  models::UNet2DConditionModel unet = models::load_unet(dir / "unet", at::kFloat);
  unet->train();
  schedulers::DDPMScheduler ddpm(schedulers::SchedulerConfig::load(dir / "scheduler" / "scheduler_config.json"));
  DenoisingLoss loss(unet, ddpm.alphas_cumprod(), {});
  Replayed r;
  std::vector<NamedParameter> params;
  for (const auto& item : unet->named_parameters()) {
    r.initial[item.key()] = item.value().detach().clone();
    params.push_back({item.key(), item.value()});
  }
  TrainableOptions options;
  options.adam = {0.9, 0.999, 1e-8, 0.01};
  options.ema = ema;
  TrainableParameters trained(params, options, std::make_shared<dist::LocalCommunicator>());
  const LrSchedule schedule{"linear", 2, 10};
  size_t conv_in = 0, conv_out_bias = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].name == "conv_in.weight") conv_in = i;
    if (params[i].name == "conv_out.bias") conv_out_bias = i;
  }
  for (int k = 0; k < 3; ++k) {
    auto in = [&](const std::string& key) { return g.at("step" + std::to_string(k) + "." + key); };
    const at::Tensor l = loss(in("latents"), in("encoder_hidden_states"), {in("noise"), in("timesteps"), {}, {}}).loss;
    r.losses.push_back(l.item<double>());
    trained.backward(l, true, true);
    trained.reduce_gradients(1, std::nullopt);
    r.grad_conv_in.push_back(trained.gradient(conv_in).clone());
    r.grad_conv_out_bias.push_back(trained.gradient(conv_out_bias).clone());
    r.lrs.push_back(1e-4 * lr_multiplier(schedule, k, 1e-4));
    trained.step(r.lrs.back());
    r.decays.push_back(trained.last_ema_decay());
  }
  r.after = trained.gather(StateKind::kMaster);
  r.ema = trained.gather(StateKind::kEma);
  return r;
}

class UNetTrainingGolden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    golden_ = new io::TensorMap(io::load_safetensors(sd::test::golden("tiny-sd1/unet_training.safetensors")));
  }
  static void TearDownTestSuite() { delete golden_; }
  static const io::TensorMap& g() { return *golden_; }
  static std::vector<std::string> tracked() {
    std::vector<std::string> names;
    for (const auto& [key, t] : g())
      if (key.rfind("after_step2.param.", 0) == 0) names.push_back(key.substr(18));
    return names;
  }
  static io::TensorMap* golden_;
};
io::TensorMap* UNetTrainingGolden::golden_ = nullptr;

TEST_F(UNetTrainingGolden, LossesGradientsLrsAndUpdatesMatch) {
  const Replayed r = replay(g(), EmaOptions{});
  for (int k = 0; k < 3; ++k) {
    auto at_step = [&](const std::string& key) { return g().at("step" + std::to_string(k) + "." + key); };
    EXPECT_TRUE(close_rel_max(at::tensor({r.losses[k]}), at_step("loss").to(at::kDouble), 1e-4)) << k;
    EXPECT_DOUBLE_EQ(r.lrs[k], at_step("lr").item<double>()) << k;
    EXPECT_TRUE(close_rel_max(r.grad_conv_in[k], at_step("grad.conv_in.weight"), 1e-3)) << k;
    EXPECT_TRUE(close_rel_max(r.grad_conv_out_bias[k], at_step("grad.conv_out.bias"), 1e-3)) << k;
    EXPECT_NEAR(r.decays[k], at_step("ema_decay").item<double>(), 1e-15) << k;
  }
  ASSERT_EQ(tracked().size(), 7u);
  for (const auto& name : tracked()) {
    const at::Tensor expected = g().at("after_step2.param." + name);
    EXPECT_TRUE(close_rel_max(r.after.at(name), expected, 1e-5)) << name;
    // The update itself, to the full-UNet steps' tolerance (parameters near 1 keep ~3 digits of a 1e-4 update).
    EXPECT_TRUE(close_rel_max(r.after.at(name) - r.initial.at(name), expected - r.initial.at(name), 1e-2)) << name;
    EXPECT_TRUE(close_rel_max(r.ema.at(name), g().at("after_step2.ema." + name), 1e-5)) << name;
  }
}

TEST_F(UNetTrainingGolden, EmaWarmupVariant) {
  EmaOptions warmup;
  warmup.use_warmup = true;
  const Replayed r = replay(g(), warmup);
  for (int k = 0; k < 3; ++k)
    EXPECT_NEAR(r.decays[k], g().at("step" + std::to_string(k) + ".ema_warmup_decay").item<double>(), 1e-15) << k;
  for (const auto& name : tracked())
    EXPECT_TRUE(close_rel_max(r.ema.at(name), g().at("after_step2.ema_warmup." + name), 1e-5)) << name;
}

TEST(EmaDecay, DiffusersSchedule) {
  EmaOptions o;
  EXPECT_EQ(ema_decay(o, 1), 0.0);
  EXPECT_DOUBLE_EQ(ema_decay(o, 2), 2.0 / 11);
  EXPECT_DOUBLE_EQ(ema_decay(o, 100000000), 0.9999);
  o.update_after_step = 5;
  EXPECT_EQ(ema_decay(o, 6), 0.0);
  EXPECT_DOUBLE_EQ(ema_decay(o, 7), 2.0 / 11);
  // As diffusers' get_decay: the first updates copy the weights (decay 0) before min_decay applies.
  o.min_decay = 0.5;
  EXPECT_EQ(ema_decay(o, 6), 0.0);
  EXPECT_DOUBLE_EQ(ema_decay(o, 7), 0.5);
}

TEST(MinSnrWeights, GammaCapsTheSnr) {
  // SNR(t) = acp / (1 - acp); acp = 0.9 -> 9, capped at 5 -> 5/9; acp = 0.5 -> 1 -> 1; v-prediction adds 1.
  const at::Tensor acp = at::tensor({0.9f, 0.5f});
  const at::Tensor t = at::tensor({int64_t{0}, int64_t{1}});
  EXPECT_TRUE(close_rel_max(min_snr_weights(acp, t, 5.0, "epsilon"), at::tensor({5.0f / 9.0f, 1.0f}), 1e-6));
  EXPECT_TRUE(close_rel_max(min_snr_weights(acp, t, 5.0, "v_prediction"), at::tensor({0.5f, 1.0f}), 1e-6));
}

}  // namespace
}  // namespace sd::train
