#include "schedulers/ddpm.h"

#include "core/error.h"

namespace sd::schedulers {

DDPMScheduler::DDPMScheduler(SchedulerConfig config) : Scheduler(std::move(config)) {
  const auto& c = config_;
  at::Tensor betas = make_betas(c, class_name(), /*allow_sigmoid=*/true);
  if (c.rescale_betas_zero_snr) betas = rescale_zero_terminal_snr(betas);
  init_tables(betas);
  variance_type_ = c.variance_type.value_or("fixed_small");
  if (variance_type_ != "fixed_small" && variance_type_ != "fixed_small_log" && variance_type_ != "fixed_large")
    c.fail_key("variance_type", fmt::format("must be fixed_small, fixed_small_log or fixed_large for {}, got \"{}\"",
                                            class_name(), variance_type_));
  if (c.thresholding) c.fail_key("thresholding", "true (dynamic thresholding) is not supported");
  clip_sample_ = c.clip_sample.value_or(true);
  one_ = at::scalar_tensor(1.0, at::kFloat);
  // diffusers' table before set_timesteps: every training timestep, descending.
  timesteps_ = at::arange(c.num_train_timesteps - 1, -1, -1, at::kLong);
}

void DDPMScheduler::set_timesteps(int n) {
  check_steps(n);
  num_inference_steps_ = n;
  const auto t = spaced_timesteps(spacing("leading"), config_.num_train_timesteps, n, config_.steps_offset, true);
  timesteps_ = at::tensor(at::ArrayRef<double>(t), at::kDouble).to(at::kLong);
}

int64_t DDPMScheduler::previous_timestep(int64_t t) const {
  const int64_t n = num_inference_steps_ > 0 ? num_inference_steps_ : config_.num_train_timesteps;
  return t - config_.num_train_timesteps / n;
}

at::Tensor DDPMScheduler::alpha_prod_prev(int64_t prev_t) const { return prev_t >= 0 ? alphas_cumprod_[prev_t] : one_; }

at::Tensor DDPMScheduler::variance(int64_t t) const {
  const at::Tensor alpha_prod_t = alphas_cumprod_[t];
  const at::Tensor alpha_prod_t_prev = alpha_prod_prev(previous_timestep(t));
  const at::Tensor current_beta_t = 1 - alpha_prod_t / alpha_prod_t_prev;
  // The posterior variance beta~_t (DDPM paper, eq. 7), clamped so its log stays finite.
  at::Tensor var = (1 - alpha_prod_t_prev) / (1 - alpha_prod_t) * current_beta_t;
  var = at::clamp(var, 1e-20);
  if (variance_type_ == "fixed_small_log") return at::exp(0.5 * at::log(var));
  if (variance_type_ == "fixed_large") return current_beta_t;
  return var;
}

at::Tensor DDPMScheduler::step(const at::Tensor& model_output, const at::Tensor& timestep, const at::Tensor& sample,
                               Noise noise) {
  const int64_t t = timestep.item<int64_t>();
  SD_CHECK(t >= 0 && t < config_.num_train_timesteps, "{}: timestep {} outside [0, {})", class_name(), t,
           config_.num_train_timesteps);
  const int64_t prev_t = previous_timestep(t);
  const at::Tensor alpha_prod_t = alphas_cumprod_[t];
  const at::Tensor alpha_prod_t_prev = alpha_prod_prev(prev_t);
  const at::Tensor beta_prod_t = 1 - alpha_prod_t;
  const at::Tensor beta_prod_t_prev = 1 - alpha_prod_t_prev;
  const at::Tensor current_alpha_t = alpha_prod_t / alpha_prod_t_prev;
  const at::Tensor current_beta_t = 1 - current_alpha_t;

  // x_0 from the model output (DDPM paper eq. 15 for epsilon).
  at::Tensor pred_original;
  const std::string& pt = config_.prediction_type;
  if (pt == "epsilon")
    pred_original = (sample - beta_prod_t.pow(0.5) * model_output) / alpha_prod_t.pow(0.5);
  else if (pt == "sample")
    pred_original = model_output;
  else
    pred_original = alpha_prod_t.pow(0.5) * sample - beta_prod_t.pow(0.5) * model_output;
  if (clip_sample_) pred_original = pred_original.clamp(-config_.clip_sample_range, config_.clip_sample_range);

  // Posterior mean mu~_t(x_t, x_0) (eq. 7).
  const at::Tensor pred_original_coeff = (alpha_prod_t_prev.pow(0.5) * current_beta_t) / beta_prod_t;
  const at::Tensor current_sample_coeff = current_alpha_t.pow(0.5) * beta_prod_t_prev / beta_prod_t;
  at::Tensor prev = pred_original_coeff * pred_original + current_sample_coeff * sample;

  if (t > 0) {
    const at::Tensor variance_noise = noise.draw(model_output);
    if (variance_type_ == "fixed_small_log")
      prev = prev + variance(t) * variance_noise;
    else
      prev = prev + variance(t).pow(0.5) * variance_noise;
  }
  pred_original_sample_ = pred_original;
  return prev;
}

}  // namespace sd::schedulers
