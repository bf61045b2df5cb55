// DREAM training (--dream_training) in DenoisingLoss, against its definition written out step by step: the input
// and target move by what a prediction without gradient misses of the noise, and that prediction adds nothing to
// the gradient. Loss weights (--prior_loss_weight) weigh each sample's mse, with and without min-SNR.
#include "train/tasks/denoising_loss.h"

#include "core/error.h"
#include "io/safetensors.h"
#include "schedulers/ddpm.h"
#include "schedulers/scheduler_config.h"
#include "test_util.h"

namespace sd::train {
namespace {

using sd::test::close_rel_max;

struct TinyUNet {
  models::UNet2DConditionModel unet;
  at::Tensor alphas_cumprod;
};

TinyUNet tiny_unet() {
  const auto dir = sd::test::fixtures() / "tiny-sd1";
  models::UNet2DConditionModel unet = models::load_unet(dir / "unet", at::kFloat);
  unet->train();
  schedulers::DDPMScheduler ddpm(schedulers::SchedulerConfig::load(dir / "scheduler" / "scheduler_config.json"));
  return {unet, ddpm.alphas_cumprod()};
}

at::Tensor conv_in_gradient(models::UNet2DConditionModel& unet, const at::Tensor& loss) {
  unet->zero_grad();
  loss.backward();
  return unet->conv_in->weight.grad().clone();
}

TEST(DenoisingLoss, DreamMovesInputAndTargetByWhatThePredictionMisses) {
  TinyUNet tiny = tiny_unet();
  const io::TensorMap g = io::load_safetensors(sd::test::golden("tiny-sd1/unet_training.safetensors"));
  const at::Tensor latents = g.at("step0.latents"), text = g.at("step0.encoder_hidden_states");
  const at::Tensor noise = g.at("step0.noise"), t = g.at("step0.timesteps");
  const double p = 0.5;

  DenoisingLossOptions dream_options;
  dream_options.dream_training = true;
  dream_options.dream_detail_preservation = p;
  DenoisingLoss dream(tiny.unet, tiny.alphas_cumprod, dream_options);
  const at::Tensor loss = dream(latents, text, {noise, t, {}, {}}).loss;
  const at::Tensor gradient = conv_in_gradient(tiny.unet, loss);

  const at::Tensor acp = tiny.alphas_cumprod.index({t.to(at::kLong)}).view({-1, 1, 1, 1});
  const at::Tensor noisy = acp.sqrt() * latents + (1 - acp).sqrt() * noise;
  at::Tensor delta;
  {
    at::NoGradGuard no_grad;
    delta = (noise - tiny.unet->forward(noisy, t, text)) * (1 - acp).sqrt().pow(p);
  }
  const at::Tensor expected =
      at::mse_loss(tiny.unet->forward(noisy + (1 - acp).sqrt() * delta, t, text), noise + delta);
  EXPECT_TRUE(close_rel_max(loss, expected, 1e-5)) << loss.item<double>() << " vs " << expected.item<double>();
  EXPECT_TRUE(close_rel_max(gradient, conv_in_gradient(tiny.unet, expected), 1e-4));

  const at::Tensor plain = DenoisingLoss(tiny.unet, tiny.alphas_cumprod, {})(latents, text, {noise, t, {}, {}}).loss;
  EXPECT_GT((plain - loss).abs().item<double>(), 1e-4 * plain.item<double>()) << "DREAM changes the loss";
}

// kohya's loss with --prior_loss_weight: each sample's mean squared error times its weight (and its min-SNR weight),
// then the mean over the batch; weights of 1 give the unweighted loss.
TEST(DenoisingLoss, LossWeightsWeighEachSamplesError) {
  TinyUNet tiny = tiny_unet();
  const io::TensorMap g = io::load_safetensors(sd::test::golden("tiny-sd1/unet_training.safetensors"));
  const at::Tensor latents = g.at("step0.latents"), text = g.at("step0.encoder_hidden_states");
  const at::Tensor noise = g.at("step0.noise"), t = g.at("step0.timesteps");
  ASSERT_EQ(latents.size(0), 2);
  const at::Tensor weights = at::tensor({1.0f, 0.25f});
  const at::Tensor acp = tiny.alphas_cumprod.index({t.to(at::kLong)}).view({-1, 1, 1, 1});
  const at::Tensor pred = tiny.unet->forward(acp.sqrt() * latents + (1 - acp).sqrt() * noise, t, text).detach();
  const at::Tensor first = at::mse_loss(pred[0], noise[0]), second = at::mse_loss(pred[1], noise[1]);
  for (const bool snr : {false, true}) {
    SCOPED_TRACE(snr ? "with min-SNR" : "without min-SNR");
    DenoisingLossOptions options;
    if (snr) options.snr_gamma = 5.0;
    DenoisingLoss loss(tiny.unet, tiny.alphas_cumprod, options);
    const at::Tensor snr_weights = snr ? min_snr_weights(tiny.alphas_cumprod, t, 5.0, "epsilon") : at::ones({2});
    const at::Tensor expected = (first * snr_weights[0] + second * 0.25 * snr_weights[1]) / 2;
    EXPECT_TRUE(close_rel_max(loss(latents, text, {noise, t, {}, {}}, weights).loss, expected, 1e-5));
    EXPECT_TRUE(close_rel_max(loss(latents, text, {noise, t, {}, {}}, at::ones({2})).loss,
                              loss(latents, text, {noise, t, {}, {}}).loss, 1e-6));
  }
}

TEST(DenoisingLoss, DreamRefusesVPrediction) {
  TinyUNet tiny = tiny_unet();
  DenoisingLossOptions options;
  options.prediction_type = "v_prediction";
  options.dream_training = true;
  try {
    DenoisingLoss(tiny.unet, tiny.alphas_cumprod, options);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "--dream_training: DREAM is defined for epsilon prediction only (as in diffusers); this run trains "
              "v_prediction");
  }
}

}  // namespace
}  // namespace sd::train
