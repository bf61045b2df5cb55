#include "schedulers/dpm_solver.h"

#include "core/error.h"
#include "schedulers/numpy_compat.h"

namespace sd::schedulers {

namespace {

// VP parameterisation from sigma: alpha_t = 1 / sqrt(sigma^2 + 1), sigma_t = sigma * alpha_t.
std::pair<at::Tensor, at::Tensor> alpha_sigma(const at::Tensor& sigma) {
  const at::Tensor alpha_t = 1 / (sigma.pow(2) + 1).pow(0.5);
  return {alpha_t, sigma * alpha_t};
}

at::Tensor lambda_of(const at::Tensor& alpha_t, const at::Tensor& sigma_t) {
  return at::log(alpha_t) - at::log(sigma_t);
}

}  // namespace

DPMSolverMultistepScheduler::DPMSolverMultistepScheduler(SchedulerConfig config) : Scheduler(std::move(config)) {
  const auto& c = config_;
  init_tables(make_betas(c, class_name()));
  if (c.rescale_betas_zero_snr) c.fail_key("rescale_betas_zero_snr", "true is not supported by " + class_name());
  if (c.thresholding) c.fail_key("thresholding", "true (dynamic thresholding) is not supported");
  if (c.use_karras_sigmas) c.fail_key("use_karras_sigmas", "true is not supported (Karras sigmas)");
  if (c.use_lu_lambdas) c.fail_key("use_lu_lambdas", "true is not supported");
  if (c.solver_order < 1 || c.solver_order > 3)
    c.fail_key("solver_order", fmt::format("must be 1, 2 or 3, got {}", c.solver_order));
  // diffusers maps the DEIS / UniPC names to their DPM-Solver equivalents.
  algorithm_type_ = c.algorithm_type == "deis" ? "dpmsolver++" : c.algorithm_type;
  if (algorithm_type_ != "dpmsolver" && algorithm_type_ != "dpmsolver++" && algorithm_type_ != "sde-dpmsolver" &&
      algorithm_type_ != "sde-dpmsolver++")
    c.fail_key("algorithm_type", fmt::format("must be one of dpmsolver, dpmsolver++, sde-dpmsolver, sde-dpmsolver++, "
                                             "got \"{}\"",
                                             c.algorithm_type));
  solver_type_ = c.solver_type;
  if (solver_type_ == "logrho" || solver_type_ == "bh1" || solver_type_ == "bh2") solver_type_ = "midpoint";
  if (solver_type_ != "midpoint" && solver_type_ != "heun")
    c.fail_key("solver_type", fmt::format("must be midpoint or heun, got \"{}\"", c.solver_type));
  if (c.solver_order == 3 && algorithm_type_.rfind("sde-", 0) == 0)
    c.fail_key("solver_order", "3 is not supported with the sde-* algorithm types");
  if (c.variance_type && *c.variance_type != "learned" && *c.variance_type != "learned_range")
    c.fail_key("variance_type", fmt::format("must be null, learned or learned_range, got \"{}\"", *c.variance_type));

  const at::Tensor alpha_t = at::sqrt(alphas_cumprod_);
  const at::Tensor sigma_t = at::sqrt(1 - alphas_cumprod_);
  lambda_t_ = at::log(alpha_t) - at::log(sigma_t);
  sigmas_ = ((1 - alphas_cumprod_) / alphas_cumprod_).pow(0.5);
  timesteps_ = at::arange(c.num_train_timesteps - 1, -1, -1, at::kFloat);
  model_outputs_.assign(c.solver_order, at::Tensor());
}

void DPMSolverMultistepScheduler::set_timesteps(int n) {
  check_steps(n);
  const auto& c = config_;
  const int64_t T = c.num_train_timesteps;
  // Clipping lambda's minimum keeps the cosine schedule stable (no-op at the default -inf).
  const int64_t clipped_idx = at::searchsorted(lambda_t_.flip(0), c.lambda_min_clipped).item<int64_t>();
  const int64_t last_timestep = T - clipped_idx;

  // n + 1 points with the final (t = 0 end) one dropped, unlike DDIM.
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

  // Sigmas at those (integer) timesteps, then the sigma of t = 0 as the end point.
  const at::Tensor full = ((1 - alphas_cumprod_) / alphas_cumprod_).pow(0.5);
  const at::Tensor full_d = full.to(at::kDouble).contiguous();
  const std::vector<double> fp(full_d.data_ptr<double>(), full_d.data_ptr<double>() + full_d.numel());
  std::vector<double> sig = np::interp(ts, fp);
  const at::Tensor sigma_last = ((1 - alphas_cumprod_[0]) / alphas_cumprod_[0]).pow(0.5);
  sig.push_back(sigma_last.item<double>());
  sigmas_ = at::tensor(at::ArrayRef<double>(sig), at::kDouble).to(at::kFloat);
  timesteps_ = at::tensor(at::ArrayRef<double>(ts), at::kDouble).to(at::kLong);
  num_inference_steps_ = static_cast<int>(ts.size());
  model_outputs_.assign(c.solver_order, at::Tensor());
  lower_order_nums_ = 0;
  step_index_ = -1;
}

void DPMSolverMultistepScheduler::init_step_index(const at::Tensor& t) {
  const at::Tensor candidates = (timesteps_ == t.to(timesteps_.device())).nonzero();
  // Unknown timestep: diffusers falls back to the last index.
  if (candidates.size(0) == 0)
    step_index_ = timesteps_.size(0) - 1;
  else
    step_index_ = candidates[candidates.size(0) > 1 ? 1 : 0][0].item<int64_t>();
}

at::Tensor DPMSolverMultistepScheduler::convert_model_output(at::Tensor model_output, const at::Tensor& sample) const {
  const std::string& pt = config_.prediction_type;
  const at::Tensor sigma = sigmas_[step_index_];
  auto [alpha_t, sigma_t] = alpha_sigma(sigma);
  // Learned-variance models output [mean, variance] channels; only the mean is used.
  if (config_.variance_type && pt == "epsilon") model_output = model_output.slice(1, 0, 3);
  if (algorithm_type_ == "dpmsolver++" || algorithm_type_ == "sde-dpmsolver++") {
    if (pt == "epsilon") return (sample - sigma_t * model_output) / alpha_t;
    if (pt == "sample") return model_output;
    return alpha_t * sample - sigma_t * model_output;
  }
  if (pt == "epsilon") return model_output;
  if (pt == "sample") return (sample - alpha_t * model_output) / sigma_t;
  return alpha_t * model_output + sigma_t * sample;
}

at::Tensor DPMSolverMultistepScheduler::first_order(const at::Tensor& m0, const at::Tensor& sample,
                                                    const at::Tensor& noise) const {
  auto [alpha_t, sigma_t] = alpha_sigma(sigmas_[step_index_ + 1]);
  auto [alpha_s, sigma_s] = alpha_sigma(sigmas_[step_index_]);
  const at::Tensor h = lambda_of(alpha_t, sigma_t) - lambda_of(alpha_s, sigma_s);
  if (algorithm_type_ == "dpmsolver++") return (sigma_t / sigma_s) * sample - (alpha_t * (at::exp(-h) - 1.0)) * m0;
  if (algorithm_type_ == "dpmsolver") return (alpha_t / alpha_s) * sample - (sigma_t * (at::exp(h) - 1.0)) * m0;
  if (algorithm_type_ == "sde-dpmsolver++")
    return (sigma_t / sigma_s * at::exp(-h)) * sample + (alpha_t * (1 - at::exp(-2.0 * h))) * m0 +
           sigma_t * at::sqrt(1.0 - at::exp(-2 * h)) * noise;
  return (alpha_t / alpha_s) * sample - 2.0 * (sigma_t * (at::exp(h) - 1.0)) * m0 +
         sigma_t * at::sqrt(at::exp(2 * h) - 1.0) * noise;
}

at::Tensor DPMSolverMultistepScheduler::second_order(const at::Tensor& sample, const at::Tensor& noise) const {
  auto [alpha_t, sigma_t] = alpha_sigma(sigmas_[step_index_ + 1]);
  auto [alpha_s0, sigma_s0] = alpha_sigma(sigmas_[step_index_]);
  auto [alpha_s1, sigma_s1] = alpha_sigma(sigmas_[step_index_ - 1]);
  const at::Tensor lambda_t = lambda_of(alpha_t, sigma_t);
  const at::Tensor lambda_s0 = lambda_of(alpha_s0, sigma_s0);
  const at::Tensor lambda_s1 = lambda_of(alpha_s1, sigma_s1);
  const at::Tensor& m0 = model_outputs_.end()[-1];
  const at::Tensor& m1 = model_outputs_.end()[-2];
  const at::Tensor h = lambda_t - lambda_s0, h_0 = lambda_s0 - lambda_s1;
  const at::Tensor r0 = h_0 / h;
  const at::Tensor& D0 = m0;
  const at::Tensor D1 = (1.0 / r0) * (m0 - m1);
  const bool midpoint = solver_type_ == "midpoint";
  if (algorithm_type_ == "dpmsolver++") {
    // https://arxiv.org/abs/2211.01095
    if (midpoint)
      return (sigma_t / sigma_s0) * sample - (alpha_t * (at::exp(-h) - 1.0)) * D0 -
             0.5 * (alpha_t * (at::exp(-h) - 1.0)) * D1;
    return (sigma_t / sigma_s0) * sample - (alpha_t * (at::exp(-h) - 1.0)) * D0 +
           (alpha_t * ((at::exp(-h) - 1.0) / h + 1.0)) * D1;
  }
  if (algorithm_type_ == "dpmsolver") {
    // https://arxiv.org/abs/2206.00927
    if (midpoint)
      return (alpha_t / alpha_s0) * sample - (sigma_t * (at::exp(h) - 1.0)) * D0 -
             0.5 * (sigma_t * (at::exp(h) - 1.0)) * D1;
    return (alpha_t / alpha_s0) * sample - (sigma_t * (at::exp(h) - 1.0)) * D0 -
           (sigma_t * ((at::exp(h) - 1.0) / h - 1.0)) * D1;
  }
  if (algorithm_type_ == "sde-dpmsolver++") {
    if (midpoint)
      return (sigma_t / sigma_s0 * at::exp(-h)) * sample + (alpha_t * (1 - at::exp(-2.0 * h))) * D0 +
             0.5 * (alpha_t * (1 - at::exp(-2.0 * h))) * D1 + sigma_t * at::sqrt(1.0 - at::exp(-2.0 * h)) * noise;
    return (sigma_t / sigma_s0 * at::exp(-h)) * sample + (alpha_t * (1 - at::exp(-2.0 * h))) * D0 +
           (alpha_t * ((1.0 - at::exp(-2.0 * h)) / (-2.0 * h) + 1.0)) * D1 +
           sigma_t * at::sqrt(1.0 - at::exp(-2.0 * h)) * noise;
  }
  if (midpoint)
    return (alpha_t / alpha_s0) * sample - 2.0 * (sigma_t * (at::exp(h) - 1.0)) * D0 -
           (sigma_t * (at::exp(h) - 1.0)) * D1 + sigma_t * at::sqrt(at::exp(2.0 * h) - 1.0) * noise;
  return (alpha_t / alpha_s0) * sample - 2.0 * (sigma_t * (at::exp(h) - 1.0)) * D0 -
         2.0 * (sigma_t * ((at::exp(h) - 1.0) / h - 1.0)) * D1 + sigma_t * at::sqrt(at::exp(2.0 * h) - 1.0) * noise;
}

at::Tensor DPMSolverMultistepScheduler::third_order(const at::Tensor& sample) const {
  auto [alpha_t, sigma_t] = alpha_sigma(sigmas_[step_index_ + 1]);
  auto [alpha_s0, sigma_s0] = alpha_sigma(sigmas_[step_index_]);
  auto [alpha_s1, sigma_s1] = alpha_sigma(sigmas_[step_index_ - 1]);
  auto [alpha_s2, sigma_s2] = alpha_sigma(sigmas_[step_index_ - 2]);
  const at::Tensor lambda_t = lambda_of(alpha_t, sigma_t);
  const at::Tensor lambda_s0 = lambda_of(alpha_s0, sigma_s0);
  const at::Tensor lambda_s1 = lambda_of(alpha_s1, sigma_s1);
  const at::Tensor lambda_s2 = lambda_of(alpha_s2, sigma_s2);
  const at::Tensor& m0 = model_outputs_.end()[-1];
  const at::Tensor& m1 = model_outputs_.end()[-2];
  const at::Tensor& m2 = model_outputs_.end()[-3];
  const at::Tensor h = lambda_t - lambda_s0, h_0 = lambda_s0 - lambda_s1, h_1 = lambda_s1 - lambda_s2;
  const at::Tensor r0 = h_0 / h, r1 = h_1 / h;
  const at::Tensor& D0 = m0;
  const at::Tensor D1_0 = (1.0 / r0) * (m0 - m1), D1_1 = (1.0 / r1) * (m1 - m2);
  const at::Tensor D1 = D1_0 + (r0 / (r0 + r1)) * (D1_0 - D1_1);
  const at::Tensor D2 = (1.0 / (r0 + r1)) * (D1_0 - D1_1);
  if (algorithm_type_ == "dpmsolver++")
    return (sigma_t / sigma_s0) * sample - (alpha_t * (at::exp(-h) - 1.0)) * D0 +
           (alpha_t * ((at::exp(-h) - 1.0) / h + 1.0)) * D1 -
           (alpha_t * ((at::exp(-h) - 1.0 + h) / h.pow(2) - 0.5)) * D2;
  return (alpha_t / alpha_s0) * sample - (sigma_t * (at::exp(h) - 1.0)) * D0 -
         (sigma_t * ((at::exp(h) - 1.0) / h - 1.0)) * D1 - (sigma_t * ((at::exp(h) - 1.0 - h) / h.pow(2) - 0.5)) * D2;
}

at::Tensor DPMSolverMultistepScheduler::step(const at::Tensor& model_output, const at::Tensor& t,
                                             const at::Tensor& sample, Noise noise) {
  SD_CHECK(num_inference_steps_ > 0, "{}: call set_timesteps before step", class_name());
  if (step_index_ < 0) init_step_index(t);
  const auto& c = config_;
  const int64_t len = timesteps_.size(0);
  SD_CHECK(step_index_ < len, "{}: step called after the last timestep", class_name());
  // Short runs finish with lower-order steps, which is more stable below ~15 steps.
  const bool lower_order_final = step_index_ == len - 1 && (c.euler_at_final || (c.lower_order_final && len < 15));
  const bool lower_order_second = step_index_ == len - 2 && c.lower_order_final && len < 15;

  const at::Tensor converted = convert_model_output(model_output, sample);
  for (size_t i = 0; i + 1 < model_outputs_.size(); ++i) model_outputs_[i] = model_outputs_[i + 1];
  model_outputs_.back() = converted;

  at::Tensor draw;
  if (algorithm_type_ == "sde-dpmsolver" || algorithm_type_ == "sde-dpmsolver++") draw = noise.draw(converted);

  at::Tensor prev;
  if (c.solver_order == 1 || lower_order_nums_ < 1 || lower_order_final)
    prev = first_order(converted, sample, draw);
  else if (c.solver_order == 2 || lower_order_nums_ < 2 || lower_order_second)
    prev = second_order(sample, draw);
  else
    prev = third_order(sample);
  if (lower_order_nums_ < c.solver_order) ++lower_order_nums_;
  ++step_index_;
  return prev;
}

}  // namespace sd::schedulers
