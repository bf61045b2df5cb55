// The loss diffusers' train_text_to_image.py computes for a micro-batch once it has latents and text embeddings,
// with every random draw passed in (so the same code trains and replays a reference run):
//   noise    += noise_offset * offset_noise                      (offset_noise: [N, C, 1, 1])
//   noisy     = DDPM.add_noise(latents, noise + input_perturbation * perturbation, t)
//   target    = noise (epsilon) or DDPM.get_velocity(latents, noise, t) (v_prediction)
//   with dream_training (DREAM, arXiv 2312.00210, as diffusers' compute_dream_and_update_latents; epsilon only):
//     delta   = (noise - unet(noisy, t, text) without gradient) * sqrt(1 - acp[t])^dream_detail_preservation
//     noisy  += sqrt(1 - acp[t]) * delta,  target += delta
//   loss      = mse(unet(noisy, t, text), target), or with snr_gamma the min-SNR weighted mean
//               (arXiv 2303.09556): per-sample mse * min(snr, gamma) / snr, snr + 1 for v_prediction;
//               with loss weights (kohya's --prior_loss_weight) each sample's mse times its weight, then the mean.
// Latents, noise and targets stay float32; the UNet runs in its compute dtype; the loss is float32.
#pragma once
#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "models/unet/unet_2d_condition.h"

namespace sd::train {

struct DenoisingLossOptions {
  std::string prediction_type = "epsilon";  // or v_prediction
  std::optional<double> snr_gamma;
  double noise_offset = 0;
  double input_perturbation = 0;
  bool dream_training = false;
  double dream_detail_preservation = 1.0;
};

struct DenoisingDraws {
  at::Tensor noise;         // [N, C, h, w]
  at::Tensor timesteps;     // [N] int64
  at::Tensor offset_noise;  // [N, C, 1, 1], used when noise_offset != 0
  at::Tensor perturbation;  // [N, C, h, w], used when input_perturbation != 0
};

struct DenoisingLossResult {
  at::Tensor loss;         // float32 scalar
  at::Tensor snr_weights;  // [N] float32 (undefined without snr_gamma)
};

// min(snr, gamma) / snr per timestep (snr + 1 for v_prediction), as train_text_to_image.py weights the mse.
at::Tensor min_snr_weights(const at::Tensor& alphas_cumprod, const at::Tensor& timesteps, double gamma,
                           const std::string& prediction_type);

class DenoisingLoss {
 public:
  // Throws sd::Error for a prediction type other than epsilon and v_prediction.
  DenoisingLoss(models::UNet2DConditionModel unet, at::Tensor alphas_cumprod, DenoisingLossOptions options);

  // latents: [N, C, h, w] (already times the VAE's scaling factor); encoder_hidden_states: [N, L, D];
  // loss_weights: [N] float32, or undefined for all 1.
  DenoisingLossResult operator()(const at::Tensor& latents, const at::Tensor& encoder_hidden_states,
                                 const DenoisingDraws& draws, const at::Tensor& loss_weights = {});

  const DenoisingLossOptions& options() const { return options_; }

 private:
  // The UNet's prediction in float32 from float32 inputs, run in the UNet's dtype.
  at::Tensor predict(const at::Tensor& noisy, const at::Tensor& timesteps, const at::Tensor& encoder_hidden_states);
  // DREAM's correction of the input and the target by what a prediction without gradient misses of the noise.
  void apply_dream(at::Tensor& noisy, at::Tensor& target, const at::Tensor& noise, const at::Tensor& timesteps,
                   const at::Tensor& encoder_hidden_states);

  models::UNet2DConditionModel unet_;
  at::Tensor alphas_cumprod_;
  DenoisingLossOptions options_;
};

}  // namespace sd::train
