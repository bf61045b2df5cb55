#include "train/tasks/textual_inversion_step.h"

#include <torch/autograd.h>

#include "core/error.h"
#include "schedulers/ddpm.h"

namespace sd::train {

TextualInversionStep::TextualInversionStep(models::ClipTextModel text_encoder, models::AutoencoderKL vae,
                                           models::UNet2DConditionModel unet, at::Tensor alphas_cumprod,
                                           std::string prediction_type, int64_t first_placeholder_id,
                                           int64_t num_vectors)
    : text_encoder_(std::move(text_encoder)),
      vae_(std::move(vae)),
      unet_(std::move(unet)),
      alphas_cumprod_(std::move(alphas_cumprod)),
      prediction_type_(std::move(prediction_type)),
      first_placeholder_id_(first_placeholder_id),
      num_vectors_(num_vectors),
      weight_dtype_(unet_->parameters().front().scalar_type()) {
  SD_CHECK(prediction_type_ == "epsilon" || prediction_type_ == "v_prediction",
           "scheduler prediction_type '{}' cannot be trained (expected epsilon or v_prediction)", prediction_type_);
  for (auto* module : {static_cast<torch::nn::Module*>(text_encoder_.get()),
                       static_cast<torch::nn::Module*>(vae_.get()), static_cast<torch::nn::Module*>(unet_.get())})
    for (auto& p : module->parameters()) p.set_requires_grad(false);
}

models::DiagonalGaussian TextualInversionStep::encode(const at::Tensor& pixel_values) {
  torch::NoGradGuard no_grad;
  return vae_->encode(pixel_values.to(weight_dtype_));
}

at::Tensor TextualInversionStep::token_embeddings(const at::Tensor& input_ids, const at::Tensor& learned) {
  at::Tensor frozen;
  {
    torch::NoGradGuard no_grad;
    // Placeholder ids may lie beyond the frozen table; their rows are replaced below anyway.
    const int64_t rows_in_table = text_encoder_->token_embedding()->weight.size(0);
    frozen = text_encoder_->token_embedding()->forward(input_ids.clamp_max(rows_in_table - 1));  // [N, S, D]
  }
  const at::Tensor offset = input_ids - first_placeholder_id_;
  const at::Tensor is_learned = (offset >= 0).logical_and(offset < num_vectors_);  // [N, S]
  const at::Tensor rows = learned.index_select(0, offset.clamp(0, num_vectors_ - 1).flatten())
                              .view({input_ids.size(0), input_ids.size(1), -1});
  return at::where(is_learned.unsqueeze(-1), rows.to(frozen.scalar_type()), frozen);
}

TextualInversionForward TextualInversionStep::forward(const at::Tensor& mean, const at::Tensor& std,
                                                      const at::Tensor& input_ids, const TextualInversionDraws& draws,
                                                      const at::Tensor& learned) {
  TextualInversionForward out;
  {
    torch::NoGradGuard no_grad;
    const at::Tensor eps = draws.posterior_eps.to(mean.scalar_type());
    out.latents = (mean + std * eps) * vae_->scaling_factor();
    const at::Tensor noise = draws.noise.to(out.latents.scalar_type());
    out.noisy_latents = schedulers::add_noise(alphas_cumprod_, out.latents, noise, draws.timesteps);
    out.target = prediction_type_ == "epsilon"
                     ? noise
                     : schedulers::get_velocity(alphas_cumprod_, out.latents, noise, draws.timesteps);
  }
  out.encoder_hidden_states = text_encoder_->forward(input_ids, token_embeddings(input_ids, learned)).last_hidden_state;
  out.model_pred = unet_->forward(out.noisy_latents, draws.timesteps, out.encoder_hidden_states.to(weight_dtype_));
  out.loss = at::mse_loss(out.model_pred.to(at::kFloat), out.target.to(at::kFloat));
  return out;
}

}  // namespace sd::train
