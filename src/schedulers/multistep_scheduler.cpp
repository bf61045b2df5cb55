#include "schedulers/multistep_scheduler.h"

#include "core/error.h"
#include "schedulers/numpy_compat.h"
#include "schedulers/sigmas.h"

namespace sd::schedulers {

MultistepScheduler::MultistepScheduler(SchedulerConfig config, const std::string& class_name)
    : Scheduler(std::move(config)) {
  const auto& c = config_;
  init_tables(make_betas(c, class_name));
  if (c.rescale_betas_zero_snr) c.fail_key("rescale_betas_zero_snr", "true is not supported by " + class_name);
  if (c.thresholding) c.fail_key("thresholding", "true (dynamic thresholding) is not supported");
  if (c.solver_order < 1) c.fail_key("solver_order", fmt::format("must be >= 1, got {}", c.solver_order));
  // Before set_timesteps: every training timestep (descending) and its sigma.
  sigmas_ = ((1 - alphas_cumprod_) / alphas_cumprod_).pow(0.5);
  timesteps_ = at::arange(c.num_train_timesteps - 1, -1, -1, at::kFloat);
}

void MultistepScheduler::set_table(int n, int64_t last_timestep) {
  const auto& c = config_;
  const int64_t T = c.num_train_timesteps;
  std::vector<double> ts;
  const std::string sp = spacing("linspace");
  if (sp == "linspace") {
    ts = np::reversed(np::round(np::linspace(0, static_cast<double>(last_timestep - 1), n + 1)));
    ts.pop_back();
  } else if (sp == "leading") {
    const int64_t step_ratio = last_timestep / (n + 1);
    for (int64_t i = n; i >= 1; --i) ts.push_back(static_cast<double>(i * step_ratio + c.steps_offset));
  } else {
    ts = np::round(np::arange(static_cast<double>(last_timestep), 0, -(static_cast<double>(T) / n)));
    for (double& v : ts) v -= 1;
  }

  const std::vector<double> full = training_sigmas(alphas_cumprod_);
  std::vector<double> sig;
  if (c.use_karras_sigmas) {
    sig = karras_sigmas(full.front(), full.back(), n);
    ts = np::round(sigmas_to_timesteps(sig, full));
    sig.push_back(sig.back());  // the final step stays at sigma_min
  } else {
    sig = np::interp(ts, full);
    sig.push_back(full.front());  // the final step lands on sigma(t = 0)
  }
  sigmas_ = to_tensor(sig, at::kFloat);
  timesteps_ = to_tensor(ts, at::kLong);
  num_inference_steps_ = static_cast<int>(ts.size());
  model_outputs_.assign(c.solver_order, at::Tensor());
  lower_order_nums_ = 0;
  step_index_ = -1;
}

void MultistepScheduler::init_step_index(const at::Tensor& t) {
  step_index_ = index_of_timestep(timesteps_, t).value_or(timesteps_.size(0) - 1);
}

at::Tensor MultistepScheduler::data_prediction(const at::Tensor& model_output, const at::Tensor& sample) const {
  const auto [alpha_t, sigma_t] = alpha_sigma(sigmas_[step_index_]);
  const std::string& pt = config_.prediction_type;
  if (pt == "epsilon") return (sample - sigma_t * model_output) / alpha_t;
  if (pt == "sample") return model_output;
  return alpha_t * sample - sigma_t * model_output;
}

at::Tensor MultistepScheduler::noise_prediction(const at::Tensor& model_output, const at::Tensor& sample) const {
  const auto [alpha_t, sigma_t] = alpha_sigma(sigmas_[step_index_]);
  const std::string& pt = config_.prediction_type;
  if (pt == "epsilon") return model_output;
  if (pt == "sample") return (sample - alpha_t * model_output) / sigma_t;
  return alpha_t * model_output + sigma_t * sample;
}

void MultistepScheduler::remember(const at::Tensor& converted_output) {
  for (size_t i = 0; i + 1 < model_outputs_.size(); ++i) model_outputs_[i] = model_outputs_[i + 1];
  model_outputs_.back() = converted_output;
}

at::Tensor MultistepScheduler::add_noise(const at::Tensor& original, const at::Tensor& noise,
                                         const at::Tensor& timesteps) const {
  std::vector<int64_t> indices;
  for (int64_t i = 0; i < timesteps.size(0); ++i) {
    const auto index = index_of_timestep(timesteps_, timesteps[i]);
    SD_CHECK(index, "{}: add_noise at timestep {}, which is not in the schedule", class_name(),
             timesteps[i].item<int64_t>());
    indices.push_back(*index);
  }
  const at::Tensor sigma = sigmas_.to(original.options()).index({at::tensor(indices, at::kLong)});
  const auto [alpha_t, sigma_t] = alpha_sigma(broadcast_per_sample(sigma, original));
  return alpha_t * original + sigma_t * noise;
}

}  // namespace sd::schedulers
