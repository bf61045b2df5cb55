#include "schedulers/unipc.h"

#include <algorithm>

#include "core/error.h"
#include "schedulers/sigmas.h"

namespace sd::schedulers {

namespace {

// sum_k weights[k] * terms[k]; weights: [K] (K <= terms.size()).
at::Tensor weighted_sum(const at::Tensor& weights, const std::vector<at::Tensor>& terms) {
  at::Tensor sum = weights[0] * terms[0];
  for (int64_t k = 1; k < weights.size(0); ++k) sum = sum + weights[k] * terms[k];
  return sum;
}

}  // namespace

UniPCMultistepScheduler::UniPCMultistepScheduler(SchedulerConfig config)
    : MultistepScheduler(std::move(config), "UniPCMultistepScheduler") {
  const auto& c = config_;
  const std::string solver_type = c.resolved_solver_type(class_name());
  if (solver_type != "bh1" && solver_type != "bh2")
    c.fail_key("solver_type", fmt::format("must be bh1 or bh2, got \"{}\"", solver_type));
  bh1_ = solver_type == "bh1";
  if (c.original.contains("solver_p") && !c.original["solver_p"].is_null())
    c.fail_key("solver_p", "must be null (another scheduler as the predictor is not supported)");
}

void UniPCMultistepScheduler::set_timesteps(int n) {
  check_steps(n);
  set_table(n, config_.num_train_timesteps);
  last_sample_ = at::Tensor();
  this_order_ = 0;
}

UniPCMultistepScheduler::Update UniPCMultistepScheduler::prepare_update(int64_t from, int64_t to, const at::Tensor& x,
                                                                        int order) const {
  const bool predict_x0 = config_.predict_x0;
  const auto [alpha_t, sigma_t] = alpha_sigma(sigmas_[to]);
  const auto [alpha_s0, sigma_s0] = alpha_sigma(sigmas_[from]);
  const at::Tensor lambda_s0 = lambda_of(alpha_s0, sigma_s0);
  const at::Tensor h = lambda_of(alpha_t, sigma_t) - lambda_s0;
  const at::Tensor& m0 = model_outputs_.back();

  Update u;
  std::vector<at::Tensor> rks;
  for (int k = 1; k < order; ++k) {
    const auto [alpha_sk, sigma_sk] = alpha_sigma(sigmas_[from - k]);
    const at::Tensor rk = (lambda_of(alpha_sk, sigma_sk) - lambda_s0) / h;
    rks.push_back(rk);
    u.D1s.push_back((model_outputs_.end()[-(k + 1)] - m0) / rk);
  }
  rks.push_back(at::ones({}, at::kFloat));
  const at::Tensor r = at::stack(rks);

  // phi_k(hh) terms of the exponential integrator, k = 1..order, with hh = -h for data prediction.
  const at::Tensor hh = predict_x0 ? -h : h;
  const at::Tensor h_phi_1 = at::expm1(hh);  // h * phi_1(h) = e^h - 1
  const at::Tensor B_h = bh1_ ? hh : at::expm1(hh);
  at::Tensor h_phi_k = h_phi_1 / hh - 1;
  int64_t factorial = 1;
  std::vector<at::Tensor> R, b;
  for (int i = 1; i <= order; ++i) {
    R.push_back(r.pow(i - 1));
    b.push_back(h_phi_k * factorial / B_h);
    factorial *= i + 1;
    h_phi_k = h_phi_k / hh - 1.0 / static_cast<double>(factorial);
  }
  u.R = at::stack(R);
  u.b = at::stack(b);
  u.first_order =
      predict_x0 ? sigma_t / sigma_s0 * x - alpha_t * h_phi_1 * m0 : alpha_t / alpha_s0 * x - sigma_t * h_phi_1 * m0;
  u.scale = (predict_x0 ? alpha_t : sigma_t) * B_h;
  return u;
}

at::Tensor UniPCMultistepScheduler::predict(const at::Tensor& sample, int order) const {
  const Update u = prepare_update(step_index_, step_index_ + 1, sample, order);
  if (u.D1s.empty()) return u.first_order;
  // Order 2 uses the closed-form weight 1/2 (as diffusers), higher orders solve the order conditions.
  const int64_t k = order - 1;
  const at::Tensor rhos = order == 2 ? at::full({1}, 0.5, at::kFloat)
                                     : at::linalg_solve(u.R.slice(0, 0, k).slice(1, 0, k), u.b.slice(0, 0, k));
  return u.first_order - u.scale * weighted_sum(rhos, u.D1s);
}

at::Tensor UniPCMultistepScheduler::correct(const at::Tensor& this_output, int order) const {
  const Update u = prepare_update(step_index_ - 1, step_index_, last_sample_, order);
  const at::Tensor rhos = order == 1 ? at::full({1}, 0.5, at::kFloat) : at::linalg_solve(u.R, u.b);
  // The newest point is this step's own output, weighted by the last rho.
  at::Tensor correction = rhos[-1] * (this_output - model_outputs_.back());
  if (!u.D1s.empty()) correction = weighted_sum(rhos.slice(0, 0, -1), u.D1s) + correction;
  return u.first_order - u.scale * correction;
}

at::Tensor UniPCMultistepScheduler::step(const at::Tensor& model_output, const at::Tensor& t,
                                         const at::Tensor& sample_in, Noise /*deterministic*/) {
  SD_CHECK(num_inference_steps_ > 0, "{}: call set_timesteps before step", class_name());
  if (step_index_ < 0) init_step_index(t);
  const auto& c = config_;
  const int64_t len = timesteps_.size(0);
  SD_CHECK(step_index_ < len, "{}: step called after the last timestep", class_name());

  const at::Tensor converted =
      c.predict_x0 ? data_prediction(model_output, sample_in) : noise_prediction(model_output, sample_in);
  const bool corrector_disabled =
      std::find(c.disable_corrector.begin(), c.disable_corrector.end(), step_index_ - 1) != c.disable_corrector.end();
  at::Tensor sample = sample_in;
  if (step_index_ > 0 && !corrector_disabled && last_sample_.defined()) sample = correct(converted, this_order_);

  remember(converted);
  // Warm up from order 1; with lower_order_final the last steps drop to the orders their remaining steps allow.
  const int64_t order = c.lower_order_final ? std::min<int64_t>(c.solver_order, len - step_index_) : c.solver_order;
  this_order_ = static_cast<int>(std::min<int64_t>(order, lower_order_nums_ + 1));
  last_sample_ = sample;
  const at::Tensor prev = predict(sample, this_order_);
  if (lower_order_nums_ < c.solver_order) ++lower_order_nums_;
  ++step_index_;
  return prev;
}

}  // namespace sd::schedulers
