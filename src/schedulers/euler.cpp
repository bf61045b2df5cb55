#include "schedulers/euler.h"

#include <cmath>

#include "core/error.h"
#include "schedulers/sigmas.h"

namespace sd::schedulers {

EulerDiscreteScheduler::EulerDiscreteScheduler(SchedulerConfig config)
    : SigmaScheduler(std::move(config), "EulerDiscreteScheduler") {
  const auto& c = config_;
  if (c.interpolation_type != "linear" && c.interpolation_type != "log_linear")
    c.fail_key("interpolation_type", fmt::format("must be linear or log_linear, got \"{}\"", c.interpolation_type));
  if (c.timestep_type != "discrete" && c.timestep_type != "continuous")
    c.fail_key("timestep_type", fmt::format("must be discrete or continuous, got \"{}\"", c.timestep_type));
}

void EulerDiscreteScheduler::set_timesteps(int n) {
  check_steps(n);
  num_inference_steps_ = n;
  const auto& c = config_;
  Schedule schedule = interpolated_schedule(n);
  if (c.interpolation_type == "log_linear") {
    // n + 1 sigmas evenly spaced in log sigma from sigma_max to sigma_min (torch.linspace in float32).
    const std::vector<double> full = training_sigmas(alphas_cumprod_);
    const double log_max = std::log(static_cast<float>(full.back()));
    const double log_min = std::log(static_cast<float>(full.front()));
    schedule.sigmas = to_doubles(at::linspace(log_max, log_min, n + 1, at::kFloat).exp());
  }
  if (c.use_karras_sigmas)
    // Only this class lets the config bound the Karras range (the others copy the code but not the keys).
    schedule =
        karras_schedule(n, c.sigma_min.value_or(schedule.sigmas.back()), c.sigma_max.value_or(schedule.sigmas.front()));
  set_tables(schedule, at::kFloat);
  if (c.timestep_type == "continuous" && c.prediction_type == "v_prediction")
    timesteps_ = sigmas_.slice(0, 0, -1).log() * 0.25;  // EDM-style c_noise
}

at::Tensor EulerDiscreteScheduler::step(const at::Tensor& model_output, const at::Tensor& t, const at::Tensor& sample,
                                        Noise noise) {
  if (step_index_ < 0) init_step_index(t);
  check_can_step();
  const at::Tensor sigma = sigmas_[step_index_];
  if (!noise.has_tensor()) (void)noise.draw(model_output);  // unused with s_churn = 0, see header
  // gamma = 0 (s_churn = 0): sigma_hat = sigma * (gamma + 1).
  const at::Tensor sigma_hat = sigma * 1.0;
  const at::Tensor pred_original = config_.prediction_type == "epsilon" ? sample - sigma_hat * model_output
                                                                        : x0_prediction(model_output, sample, sigma);
  // ODE derivative dx/dsigma and an Euler step to the next sigma.
  const at::Tensor derivative = (sample - pred_original) / sigma_hat;
  const at::Tensor dt = sigmas_[step_index_ + 1] - sigma_hat;
  pred_original_sample_ = pred_original;
  ++step_index_;
  return sample + derivative * dt;
}

EulerAncestralDiscreteScheduler::EulerAncestralDiscreteScheduler(SchedulerConfig config)
    : SigmaScheduler(std::move(config), "EulerAncestralDiscreteScheduler") {
  const auto& c = config_;
  if (c.prediction_type == "sample")
    c.fail_key("prediction_type", "\"sample\" is not supported by EulerAncestralDiscreteScheduler");
}

void EulerAncestralDiscreteScheduler::set_timesteps(int n) {
  // diffusers 0.24 gives this class neither Karras sigmas nor the EulerDiscrete options: a config's keys for
  // them are ignored, as from_config ignores keys a class does not have.
  check_steps(n);
  num_inference_steps_ = n;
  set_tables(interpolated_schedule(n), at::kFloat);
}

at::Tensor EulerAncestralDiscreteScheduler::step(const at::Tensor& model_output, const at::Tensor& t,
                                                 const at::Tensor& sample, Noise noise) {
  if (step_index_ < 0) init_step_index(t);
  check_can_step();
  const at::Tensor sigma = sigmas_[step_index_];
  const at::Tensor pred_original = x0_prediction(model_output, sample, sigma);
  const at::Tensor sigma_from = sigmas_[step_index_];
  const at::Tensor sigma_to = sigmas_[step_index_ + 1];
  // Split the move to sigma_to into a deterministic part (to sigma_down) and fresh noise (sigma_up).
  const at::Tensor sigma_up = (sigma_to.pow(2) * (sigma_from.pow(2) - sigma_to.pow(2)) / sigma_from.pow(2)).pow(0.5);
  const at::Tensor sigma_down = (sigma_to.pow(2) - sigma_up.pow(2)).pow(0.5);
  const at::Tensor derivative = (sample - pred_original) / sigma;
  const at::Tensor dt = sigma_down - sigma;
  at::Tensor prev = sample + derivative * dt;
  prev = prev + noise.draw(model_output) * sigma_up;
  pred_original_sample_ = pred_original;
  ++step_index_;
  return prev;
}

}  // namespace sd::schedulers
