// One textual-inversion training step's computation, with every random draw passed in, so the same code runs the
// training loop and replays the reference implementation's recorded steps:
//   latents = (mean + std * eps) * scaling_factor        (the VAE posterior sample; VAE frozen)
//   noisy   = DDPM.add_noise(latents, noise, timesteps)
//   context = text_encoder(ids) with the learned rows in place of the placeholder tokens' embeddings
//   loss    = mse(unet(noisy, timesteps, context), noise or velocity)   in float32
// Only the learned rows carry gradients; the text encoder's other weights, the UNet and the VAE are frozen.
#pragma once
#include <ATen/ATen.h>

#include "models/clip/clip_text_model.h"
#include "models/unet/unet_2d_condition.h"
#include "models/vae/autoencoder_kl.h"

namespace sd::train {

struct TextualInversionDraws {
  at::Tensor posterior_eps;  // [N, 4, h, w]
  at::Tensor noise;          // [N, 4, h, w]
  at::Tensor timesteps;      // [N] int64
};

struct TextualInversionForward {
  at::Tensor latents, noisy_latents, encoder_hidden_states, model_pred, target;
  at::Tensor loss;  // float32 scalar
};

class TextualInversionStep {
 public:
  // `first_placeholder_id` .. + num_vectors - 1 are the learned tokens' ids. The UNet and VAE run in their own
  // dtype (bf16 under --mixed_precision bf16); the text encoder in float32.
  TextualInversionStep(models::ClipTextModel text_encoder, models::AutoencoderKL vae, models::UNet2DConditionModel unet,
                       at::Tensor alphas_cumprod, std::string prediction_type, int64_t first_placeholder_id,
                       int64_t num_vectors);

  // pixel_values: [N, 3, H, W] in [-1, 1] -> the VAE posterior (no gradients). Deterministic, so the trainer can
  // cache it per image.
  models::DiagonalGaussian encode(const at::Tensor& pixel_values);

  // mean, std: [N, 4, h, w] posterior; input_ids: [N, 77]; learned: [num_vectors, D] float32 (requires grad).
  TextualInversionForward forward(const at::Tensor& mean, const at::Tensor& std, const at::Tensor& input_ids,
                                  const TextualInversionDraws& draws, const at::Tensor& learned);

  // The token embeddings of `input_ids` with learned rows at placeholder positions: [N, S, D].
  at::Tensor token_embeddings(const at::Tensor& input_ids, const at::Tensor& learned);

  at::ScalarType weight_dtype() const { return weight_dtype_; }

 private:
  models::ClipTextModel text_encoder_;
  models::AutoencoderKL vae_;
  models::UNet2DConditionModel unet_;
  at::Tensor alphas_cumprod_;
  std::string prediction_type_;
  int64_t first_placeholder_id_;
  int64_t num_vectors_;
  at::ScalarType weight_dtype_;
};

}  // namespace sd::train
