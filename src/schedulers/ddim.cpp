#include "schedulers/ddim.h"

#include "core/error.h"

namespace sd::schedulers {

DDIMScheduler::DDIMScheduler(SchedulerConfig config) : Scheduler(std::move(config)) {
  const auto& c = config_;
  at::Tensor betas = make_betas(c, class_name());
  if (c.rescale_betas_zero_snr) betas = rescale_zero_terminal_snr(betas);
  init_tables(betas);
  if (c.thresholding) c.fail_key("thresholding", "true (dynamic thresholding) is not supported");
  clip_sample_ = c.clip_sample.value_or(true);
  // The "previous" alpha product of the last step: 1 (a clean sample) or alpha_cumprod[0] (SD's choice).
  final_alpha_cumprod_ = c.set_alpha_to_one.value_or(true) ? at::scalar_tensor(1.0, at::kFloat) : alphas_cumprod_[0];
  timesteps_ = at::arange(c.num_train_timesteps - 1, -1, -1, at::kLong);
}

void DDIMScheduler::set_timesteps(int n) {
  check_steps(n);
  num_inference_steps_ = n;
  const auto t = spaced_timesteps(spacing("leading"), config_.num_train_timesteps, n, config_.steps_offset, true);
  timesteps_ = at::tensor(at::ArrayRef<double>(t), at::kDouble).to(at::kLong);
}

void DDIMScheduler::set_eta(double eta) {
  // Beyond 1 the direction term's variance (1 - a_prev - sigma_t^2) can turn negative.
  SD_CHECK(eta >= 0 && eta <= 1, "{}: eta must be in [0, 1], got {}", class_name(), eta);
  eta_ = eta;
}

at::Tensor DDIMScheduler::step(const at::Tensor& model_output, const at::Tensor& timestep, const at::Tensor& sample,
                               Noise noise) {
  SD_CHECK(num_inference_steps_ > 0, "{}: call set_timesteps before step", class_name());
  const int64_t t = timestep.item<int64_t>();
  SD_CHECK(t >= 0 && t < config_.num_train_timesteps, "{}: timestep {} outside [0, {})", class_name(), t,
           config_.num_train_timesteps);
  // Like diffusers, the previous timestep is t - T // n, whatever the spacing.
  const int64_t prev_t = t - config_.num_train_timesteps / num_inference_steps_;
  const at::Tensor alpha_prod_t = alphas_cumprod_[t];
  const at::Tensor alpha_prod_t_prev = prev_t >= 0 ? alphas_cumprod_[prev_t] : final_alpha_cumprod_;
  const at::Tensor beta_prod_t = 1 - alpha_prod_t;

  // DDIM paper eq. 12: predicted x_0 and the noise direction.
  at::Tensor pred_original, pred_epsilon;
  const std::string& pt = config_.prediction_type;
  if (pt == "epsilon") {
    pred_original = (sample - beta_prod_t.pow(0.5) * model_output) / alpha_prod_t.pow(0.5);
    pred_epsilon = model_output;
  } else if (pt == "sample") {
    pred_original = model_output;
    pred_epsilon = (sample - alpha_prod_t.pow(0.5) * pred_original) / beta_prod_t.pow(0.5);
  } else {
    pred_original = alpha_prod_t.pow(0.5) * sample - beta_prod_t.pow(0.5) * model_output;
    pred_epsilon = alpha_prod_t.pow(0.5) * model_output + beta_prod_t.pow(0.5) * sample;
  }
  if (clip_sample_) pred_original = pred_original.clamp(-config_.clip_sample_range, config_.clip_sample_range);

  // sigma_t(eta) = eta * sqrt(posterior variance) (eq. 16); at eta = 0 diffusers still forms it, in float32.
  const at::Tensor beta_prod_t_prev = 1 - alpha_prod_t_prev;
  const at::Tensor variance = (beta_prod_t_prev / beta_prod_t) * (1 - alpha_prod_t / alpha_prod_t_prev);
  const at::Tensor std_dev_t = eta_ * variance.pow(0.5);
  const at::Tensor pred_sample_direction = (1 - alpha_prod_t_prev - std_dev_t.pow(2)).pow(0.5) * pred_epsilon;
  pred_original_sample_ = pred_original;
  at::Tensor prev = alpha_prod_t_prev.pow(0.5) * pred_original + pred_sample_direction;
  if (eta_ > 0) prev = prev + std_dev_t * noise.draw(model_output);
  return prev;
}

}  // namespace sd::schedulers
