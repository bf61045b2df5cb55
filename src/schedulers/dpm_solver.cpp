#include "schedulers/dpm_solver.h"

#include "core/error.h"
#include "schedulers/sigmas.h"

namespace sd::schedulers {

DPMSolverMultistepScheduler::DPMSolverMultistepScheduler(SchedulerConfig config)
    : MultistepScheduler(std::move(config), "DPMSolverMultistepScheduler") {
  const auto& c = config_;
  if (c.use_lu_lambdas) c.fail_key("use_lu_lambdas", "true is not supported");
  if (c.solver_order > 3) c.fail_key("solver_order", fmt::format("must be 1, 2 or 3, got {}", c.solver_order));
  // diffusers maps the DEIS / UniPC names to their DPM-Solver equivalents.
  algorithm_type_ = c.algorithm_type == "deis" ? "dpmsolver++" : c.algorithm_type;
  if (algorithm_type_ != "dpmsolver" && algorithm_type_ != "dpmsolver++" && algorithm_type_ != "sde-dpmsolver" &&
      algorithm_type_ != "sde-dpmsolver++")
    c.fail_key("algorithm_type", fmt::format("must be one of dpmsolver, dpmsolver++, sde-dpmsolver, sde-dpmsolver++, "
                                             "got \"{}\"",
                                             c.algorithm_type));
  solver_type_ = c.resolved_solver_type(class_name());
  if (solver_type_ != "midpoint" && solver_type_ != "heun")
    c.fail_key("solver_type", fmt::format("must be midpoint or heun, got \"{}\"", solver_type_));
  if (c.solver_order == 3 && algorithm_type_.rfind("sde-", 0) == 0)
    c.fail_key("solver_order", "3 is not supported with the sde-* algorithm types");
  // diffusers' learned variances are DeepFloyd IF's (a UNet predicting 3 mean and 3 variance channels); Stable
  // Diffusion's UNet predicts no variance.
  if (c.variance_type)
    c.fail_key("variance_type",
               fmt::format("must be null for Stable Diffusion (learned variances are DeepFloyd IF's), got \"{}\"",
                           *c.variance_type));

  lambda_t_ = at::log(at::sqrt(alphas_cumprod_)) - at::log(at::sqrt(1 - alphas_cumprod_));
}

void DPMSolverMultistepScheduler::set_timesteps(int n) {
  check_steps(n);
  // Clipping lambda's minimum keeps the cosine schedule stable (no-op at the default -inf).
  const int64_t clipped_idx = at::searchsorted(lambda_t_.flip(0), config_.lambda_min_clipped).item<int64_t>();
  set_table(n, config_.num_train_timesteps - clipped_idx);
}

at::Tensor DPMSolverMultistepScheduler::convert_model_output(at::Tensor model_output, const at::Tensor& sample) const {
  if (algorithm_type_ == "dpmsolver++" || algorithm_type_ == "sde-dpmsolver++")
    return data_prediction(model_output, sample);
  return noise_prediction(model_output, sample);
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
  remember(converted);

  at::Tensor draw;
  if (step_draws_noise()) draw = noise.draw(converted);

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
