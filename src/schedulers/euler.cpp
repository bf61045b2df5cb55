#include "schedulers/euler.h"

#include <cmath>

#include "core/error.h"
#include "schedulers/numpy_compat.h"

namespace sd::schedulers {

namespace {

std::vector<double> to_doubles(const at::Tensor& t) {
  const at::Tensor d = t.to(at::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

}  // namespace

EulerSchedulerBase::EulerSchedulerBase(SchedulerConfig config) : Scheduler(std::move(config)) {
  const auto& c = config_;
  init_tables(make_betas(c, "the Euler schedulers"));
  if (c.rescale_betas_zero_snr)
    c.fail_key("rescale_betas_zero_snr", "true is not supported by the Euler schedulers (infinite sigma_max)");
  // Before set_timesteps: every training timestep (descending, float32) and its sigma, plus a final 0.
  timesteps_ = at::arange(c.num_train_timesteps - 1, -1, -1, at::kFloat);
  const at::Tensor sig = ((1 - alphas_cumprod_) / alphas_cumprod_).pow(0.5).flip(0);
  sigmas_ = at::cat({sig, at::zeros({1}, at::kFloat)});
}

void EulerSchedulerBase::set_timesteps(int n) {
  check_steps(n);
  num_inference_steps_ = n;
  const auto& c = config_;
  // Euler keeps linspace timesteps fractional (float32), unlike the integer schedulers.
  std::vector<double> ts = spaced_timesteps(spacing("linspace"), c.num_train_timesteps, n, c.steps_offset, false);
  for (double& v : ts) v = static_cast<double>(static_cast<float>(v));

  // diffusers: sigma table in float32 torch, interpolated by numpy in float64, cast back to float32.
  const at::Tensor full = ((1 - alphas_cumprod_) / alphas_cumprod_).pow(0.5);
  at::Tensor sig;
  if (discrete_options_ && c.interpolation_type == "log_linear") {
    const std::vector<double> f = to_doubles(full);
    const double log_first = std::log(static_cast<float>(f.back()));
    const double log_last = std::log(static_cast<float>(f.front()));
    sig = at::linspace(log_first, log_last, n + 1, at::kFloat).exp();
  } else {
    const std::vector<double> s = np::interp(ts, to_doubles(full));
    sig = at::tensor(at::ArrayRef<double>(s), at::kDouble).to(at::kFloat);
  }
  if (discrete_options_ && c.timestep_type == "continuous" && c.prediction_type == "v_prediction")
    timesteps_ = sig.log() * 0.25;  // EDM-style c_noise
  else
    timesteps_ = at::tensor(at::ArrayRef<double>(ts), at::kDouble).to(at::kFloat);
  sigmas_ = at::cat({sig, at::zeros({1}, at::kFloat)});
  step_index_ = -1;
}

double EulerSchedulerBase::init_noise_sigma() const {
  const at::Tensor max_sigma = sigmas_.max();
  const std::string sp = spacing("linspace");
  if (sp == "linspace" || sp == "trailing") return max_sigma.item<double>();
  return (max_sigma.pow(2) + 1).pow(0.5).item<double>();
}

void EulerSchedulerBase::init_step_index(const at::Tensor& t) {
  const at::Tensor candidates = (timesteps_ == t.to(timesteps_.device())).nonzero();
  SD_CHECK(candidates.size(0) > 0, "{}: timestep {} is not in the schedule", class_name(), t.item<double>());
  step_index_ = candidates[candidates.size(0) > 1 ? 1 : 0][0].item<int64_t>();
}

at::Tensor EulerSchedulerBase::scale_model_input(const at::Tensor& sample, const at::Tensor& t) {
  if (step_index_ < 0) init_step_index(t);
  const at::Tensor sigma = sigmas_[step_index_];
  return sample / (sigma.pow(2) + 1).pow(0.5);
}

at::Tensor EulerSchedulerBase::x0_prediction(const at::Tensor& model_output, const at::Tensor& sample,
                                             const at::Tensor& sigma) const {
  const std::string& pt = config_.prediction_type;
  if (pt == "epsilon") return sample - sigma * model_output;
  if (pt == "v_prediction")
    // x0 = c_out * v + c_skip * x with c_out = -sigma / sqrt(sigma^2 + 1), c_skip = 1 / (sigma^2 + 1).
    return model_output * (-sigma / (sigma.pow(2) + 1).pow(0.5)) + (sample / (sigma.pow(2) + 1));
  return model_output;  // "sample"
}

EulerDiscreteScheduler::EulerDiscreteScheduler(SchedulerConfig config) : EulerSchedulerBase(std::move(config)) {
  discrete_options_ = true;
  const auto& c = config_;
  if (c.interpolation_type != "linear" && c.interpolation_type != "log_linear")
    c.fail_key("interpolation_type", fmt::format("must be linear or log_linear, got \"{}\"", c.interpolation_type));
  if (c.timestep_type != "discrete" && c.timestep_type != "continuous")
    c.fail_key("timestep_type", fmt::format("must be discrete or continuous, got \"{}\"", c.timestep_type));
  if (c.use_karras_sigmas) c.fail_key("use_karras_sigmas", "true is not supported (Karras sigmas)");
}

at::Tensor EulerDiscreteScheduler::step(const at::Tensor& model_output, const at::Tensor& t, const at::Tensor& sample,
                                        Noise noise) {
  SD_CHECK(num_inference_steps_ > 0, "{}: call set_timesteps before step", class_name());
  if (step_index_ < 0) init_step_index(t);
  SD_CHECK(step_index_ + 1 < sigmas_.size(0), "{}: step called after the last timestep", class_name());
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
    : EulerSchedulerBase(std::move(config)) {
  const auto& c = config_;
  if (c.prediction_type == "sample")
    c.fail_key("prediction_type", "\"sample\" is not supported by EulerAncestralDiscreteScheduler");
}

at::Tensor EulerAncestralDiscreteScheduler::step(const at::Tensor& model_output, const at::Tensor& t,
                                                 const at::Tensor& sample, Noise noise) {
  SD_CHECK(num_inference_steps_ > 0, "{}: call set_timesteps before step", class_name());
  if (step_index_ < 0) init_step_index(t);
  SD_CHECK(step_index_ + 1 < sigmas_.size(0), "{}: step called after the last timestep", class_name());
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
