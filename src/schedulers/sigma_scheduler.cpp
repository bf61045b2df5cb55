#include "schedulers/sigma_scheduler.h"

#include "core/error.h"
#include "schedulers/numpy_compat.h"
#include "schedulers/sigmas.h"

namespace sd::schedulers {

SigmaScheduler::SigmaScheduler(SchedulerConfig config, const std::string& class_name) : Scheduler(std::move(config)) {
  const auto& c = config_;
  init_tables(make_betas(c, class_name));
  if (c.rescale_betas_zero_snr)
    c.fail_key("rescale_betas_zero_snr", "true is not supported by " + class_name + " (infinite sigma_max)");
  // Before set_timesteps: every training timestep (descending, float32) with its sigma, and a final 0.
  timesteps_ = at::arange(c.num_train_timesteps - 1, -1, -1, at::kFloat);
  sigmas_ = at::cat({((1 - alphas_cumprod_) / alphas_cumprod_).pow(0.5).flip(0), at::zeros({1}, at::kFloat)});
}

double SigmaScheduler::init_noise_sigma() const {
  const at::Tensor max_sigma = sigmas_.max();
  const std::string sp = spacing("linspace");
  if (sp == "linspace" || sp == "trailing") return max_sigma.item<double>();
  return (max_sigma.pow(2) + 1).pow(0.5).item<double>();
}

at::Tensor SigmaScheduler::scale_model_input(const at::Tensor& sample, const at::Tensor& t) {
  if (step_index_ < 0) init_step_index(t);
  const at::Tensor sigma = sigmas_[step_index_];
  return sample / (sigma.pow(2) + 1).pow(0.5);
}

at::Tensor SigmaScheduler::add_noise(const at::Tensor& original, const at::Tensor& noise,
                                     const at::Tensor& timesteps) const {
  std::vector<int64_t> indices;
  for (int64_t i = 0; i < timesteps.size(0); ++i) {
    const auto index = index_of_timestep(timesteps_, timesteps[i]);
    SD_CHECK(index, "{}: add_noise at timestep {}, which is not in the schedule", class_name(),
             timesteps[i].item<double>());
    indices.push_back(*index);
  }
  const at::Tensor sigma = sigmas_.to(original.options()).index({at::tensor(indices, at::kLong)});
  return original + noise * broadcast_per_sample(sigma, original);
}

SigmaScheduler::Schedule SigmaScheduler::interpolated_schedule(int n) const {
  const auto& c = config_;
  // Fractional linspace values are kept (as float32), unlike the integer schedulers' tables.
  std::vector<double> timesteps =
      spaced_timesteps(spacing("linspace"), c.num_train_timesteps, n, c.steps_offset, false);
  for (double& t : timesteps) t = static_cast<float>(t);
  return {timesteps, np::interp(timesteps, training_sigmas(alphas_cumprod_))};
}

SigmaScheduler::Schedule SigmaScheduler::karras_schedule(int n, double sigma_min, double sigma_max) const {
  std::vector<double> sigmas = karras_sigmas(sigma_min, sigma_max, n);
  return {sigmas_to_timesteps(sigmas, training_sigmas(alphas_cumprod_)), sigmas};
}

std::pair<SigmaScheduler::Schedule, at::ScalarType> SigmaScheduler::interpolated_or_karras_schedule(int n) const {
  const Schedule schedule = interpolated_schedule(n);
  if (!config_.use_karras_sigmas) return {schedule, at::kFloat};
  return {karras_schedule(n, schedule.sigmas.back(), schedule.sigmas.front()), at::kDouble};
}

void SigmaScheduler::set_tables(const Schedule& schedule, at::ScalarType timestep_dtype) {
  timesteps_ = to_tensor(schedule.timesteps, timestep_dtype);
  sigmas_ = at::cat({to_tensor(schedule.sigmas, at::kFloat), at::zeros({1}, at::kFloat)});
  step_index_ = -1;
}

void SigmaScheduler::init_step_index(const at::Tensor& t) {
  const auto index = index_of_timestep(timesteps_, t);
  SD_CHECK(index, "{}: timestep {} is not in the schedule", class_name(), t.item<double>());
  step_index_ = *index;
}

at::Tensor SigmaScheduler::x0_prediction(const at::Tensor& model_output, const at::Tensor& sample,
                                         const at::Tensor& sigma) const {
  const std::string& pt = config_.prediction_type;
  if (pt == "epsilon") return sample - sigma * model_output;
  if (pt == "v_prediction")
    // x0 = c_out * v + c_skip * x with c_out = -sigma / sqrt(sigma^2 + 1), c_skip = 1 / (sigma^2 + 1).
    return model_output * (-sigma / (sigma.pow(2) + 1).pow(0.5)) + (sample / (sigma.pow(2) + 1));
  return model_output;  // "sample"
}

void SigmaScheduler::check_can_step() const {
  SD_CHECK(num_inference_steps_ > 0, "{}: call set_timesteps before step", class_name());
  SD_CHECK(step_index_ + 1 < sigmas_.size(0), "{}: step called after the last timestep", class_name());
}

}  // namespace sd::schedulers
