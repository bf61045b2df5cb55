#include "train/tasks/denoising_loss.h"

#include <ATen/core/grad_mode.h>

#include "core/error.h"
#include "schedulers/ddpm.h"

namespace sd::train {

at::Tensor min_snr_weights(const at::Tensor& alphas_cumprod, const at::Tensor& timesteps, double gamma,
                           const std::string& prediction_type) {
  // diffusers' compute_snr: (sqrt(acp[t]) / sqrt(1 - acp[t]))^2 in float32.
  const at::Tensor t = timesteps.to(at::kLong);
  const at::Tensor alpha = alphas_cumprod.pow(0.5).index({t}).to(at::kFloat);
  const at::Tensor sigma = (1.0 - alphas_cumprod).pow(0.5).index({t}).to(at::kFloat);
  at::Tensor snr = (alpha / sigma).pow(2);
  if (prediction_type == "v_prediction") snr = snr + 1;
  return at::stack({snr, gamma * at::ones_like(t)}, 1).amin(1) / snr;
}

DenoisingLoss::DenoisingLoss(models::UNet2DConditionModel unet, at::Tensor alphas_cumprod, DenoisingLossOptions options)
    : unet_(std::move(unet)), alphas_cumprod_(std::move(alphas_cumprod)), options_(std::move(options)) {
  SD_CHECK(options_.prediction_type == "epsilon" || options_.prediction_type == "v_prediction",
           "prediction_type '{}' cannot be trained (expected epsilon or v_prediction)", options_.prediction_type);
  SD_CHECK(!options_.snr_gamma || *options_.snr_gamma > 0, "--snr_gamma must be positive, got {}",
           options_.snr_gamma.value_or(0));
  SD_CHECK(!options_.dream_training || options_.prediction_type == "epsilon",
           "--dream_training: DREAM is defined for epsilon prediction only (as in diffusers); this run trains {}",
           options_.prediction_type);
}

at::Tensor DenoisingLoss::predict(const at::Tensor& noisy, const at::Tensor& timesteps,
                                  const at::Tensor& encoder_hidden_states) {
  const at::ScalarType dtype = unet_->conv_in->weight.scalar_type();
  return unet_->forward(noisy.to(dtype), timesteps, encoder_hidden_states.to(dtype)).to(at::kFloat);
}

void DenoisingLoss::apply_dream(at::Tensor& noisy, at::Tensor& target, const at::Tensor& noise,
                                const at::Tensor& timesteps, const at::Tensor& encoder_hidden_states) {
  const at::Tensor acp = alphas_cumprod_.to(at::kFloat).index({timesteps.to(at::kLong)}).view({-1, 1, 1, 1});
  const at::Tensor sigma = (1.0 - acp).pow(0.5);
  const at::Tensor delta =
      (noise - predict(noisy, timesteps, encoder_hidden_states)) * sigma.pow(options_.dream_detail_preservation);
  noisy = noisy + sigma * delta;
  target = target + delta;
}

DenoisingLossResult DenoisingLoss::operator()(const at::Tensor& latents_in, const at::Tensor& encoder_hidden_states,
                                              const DenoisingDraws& draws, const at::Tensor& loss_weights) {
  at::Tensor noisy, target;
  {
    at::NoGradGuard no_grad;
    const at::Tensor latents = latents_in.to(at::kFloat);
    at::Tensor noise = draws.noise.to(at::kFloat);
    if (options_.noise_offset != 0) noise = noise + options_.noise_offset * draws.offset_noise.to(at::kFloat);
    const at::Tensor noised_with = options_.input_perturbation != 0
                                       ? noise + options_.input_perturbation * draws.perturbation.to(at::kFloat)
                                       : noise;
    noisy = schedulers::add_noise(alphas_cumprod_, latents, noised_with, draws.timesteps);
    target = options_.prediction_type == "epsilon"
                 ? noise
                 : schedulers::get_velocity(alphas_cumprod_, latents, noise, draws.timesteps);
    if (options_.dream_training) apply_dream(noisy, target, noise, draws.timesteps, encoder_hidden_states);
  }
  const at::Tensor model_pred = predict(noisy, draws.timesteps, encoder_hidden_states);
  DenoisingLossResult result;
  if (!options_.snr_gamma && !loss_weights.defined()) {
    result.loss = at::mse_loss(model_pred, target);
    return result;
  }
  // kohya's order: the per-sample mse times the loss weights, then times the min-SNR weights, then the mean.
  at::Tensor per_sample = at::mse_loss(model_pred, target, at::Reduction::None).mean({1, 2, 3});
  if (loss_weights.defined()) per_sample = per_sample * loss_weights.to(at::kFloat);
  if (options_.snr_gamma) {
    result.snr_weights =
        min_snr_weights(alphas_cumprod_, draws.timesteps, *options_.snr_gamma, options_.prediction_type);
    per_sample = per_sample * result.snr_weights;
  }
  result.loss = per_sample.mean();
  return result;
}

}  // namespace sd::train
