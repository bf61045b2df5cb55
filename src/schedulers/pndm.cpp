#include "schedulers/pndm.h"

#include "core/error.h"
#include "schedulers/numpy_compat.h"

namespace sd::schedulers {

PNDMScheduler::PNDMScheduler(SchedulerConfig config) : Scheduler(std::move(config)) {
  const auto& c = config_;
  at::Tensor betas = make_betas(c, class_name());
  if (c.rescale_betas_zero_snr) betas = rescale_zero_terminal_snr(betas);
  init_tables(betas);
  if (c.prediction_type == "sample")
    c.fail_key("prediction_type", "\"sample\" is not supported by PNDMScheduler (epsilon or v_prediction)");
  final_alpha_cumprod_ = c.set_alpha_to_one.value_or(false) ? at::scalar_tensor(1.0, at::kFloat) : alphas_cumprod_[0];
  timesteps_ = at::arange(c.num_train_timesteps - 1, -1, -1, at::kLong);
}

void PNDMScheduler::set_timesteps(int n) {
  check_steps(n);
  num_inference_steps_ = n;
  const int64_t T = config_.num_train_timesteps;
  // Ascending base table (diffusers' _timesteps).
  std::vector<double> base_d = np::reversed(spaced_timesteps(spacing("leading"), T, n, config_.steps_offset, true));
  std::vector<int64_t> base(base_d.begin(), base_d.end());
  const auto len = static_cast<int64_t>(base.size());

  std::vector<int64_t> table;
  prk_timesteps_.clear();
  if (config_.skip_prk_steps) {
    // PLMS only (crowsonkb's sampler): base[:-1] + base[-2:-1] + base[-1:], reversed; the second entry repeats.
    std::vector<int64_t> plms(base.begin(), base.end() - 1);
    if (len >= 2) plms.push_back(base[len - 2]);
    plms.push_back(base[len - 1]);
    table.assign(plms.rbegin(), plms.rend());
  } else {
    // Runge-Kutta warm-up on the last kOrder base steps, each with a half-step midpoint.
    std::vector<int64_t> tail(base.end() - std::min<int64_t>(kOrder, len), base.end());
    std::vector<int64_t> prk;
    for (int64_t v : tail) {
      prk.push_back(v);
      prk.push_back(v + T / n / 2);
    }
    prk.pop_back();  // prk[:-1]
    std::vector<int64_t> doubled;
    for (int64_t v : prk) {
      doubled.push_back(v);
      doubled.push_back(v);
    }
    // [1:-1], reversed
    for (auto it = doubled.rbegin() + 1; it + 1 < doubled.rend(); ++it) prk_timesteps_.push_back(*it);
    table = prk_timesteps_;
    for (int64_t i = len - 4; i >= 0; --i) table.push_back(base[i]);  // base[:-3] reversed
  }
  timesteps_ = at::tensor(at::ArrayRef<int64_t>(table), at::kLong);
  ets_.clear();
  cur_model_output_ = at::Tensor();
  cur_sample_ = at::Tensor();
  counter_ = 0;
}

at::Tensor PNDMScheduler::step(const at::Tensor& model_output, const at::Tensor& timestep, const at::Tensor& sample,
                               Noise /*deterministic*/) {
  SD_CHECK(num_inference_steps_ > 0, "{}: call set_timesteps before step", class_name());
  const int64_t t = timestep.item<int64_t>();
  if (counter_ < static_cast<int64_t>(prk_timesteps_.size()) && !config_.skip_prk_steps)
    return step_prk(model_output, t, sample);
  return step_plms(model_output, t, sample);
}

at::Tensor PNDMScheduler::step_prk(const at::Tensor& model_output_in, int64_t t, const at::Tensor& sample) {
  const int64_t T = config_.num_train_timesteps;
  const int64_t diff_to_prev = counter_ % 2 ? 0 : T / num_inference_steps_ / 2;
  const int64_t prev_t = t - diff_to_prev;
  const int64_t t_base = prk_timesteps_[counter_ / 4 * 4];

  // RK4 weights 1/6, 1/3, 1/3, 1/6 over the four evaluations of one step.
  at::Tensor model_output = model_output_in;
  auto accumulate = [&](double w) {
    cur_model_output_ = cur_model_output_.defined() ? cur_model_output_ + w * model_output : w * model_output;
  };
  if (counter_ % 4 == 0) {
    accumulate(1.0 / 6);
    ets_.push_back(model_output);
    cur_sample_ = sample;
  } else if ((counter_ - 1) % 4 == 0 || (counter_ - 2) % 4 == 0) {
    accumulate(1.0 / 3);
  } else {
    model_output =
        cur_model_output_.defined() ? cur_model_output_ + (1.0 / 6) * model_output : (1.0 / 6) * model_output;
    cur_model_output_ = at::Tensor();
  }
  const at::Tensor cur = cur_sample_.defined() ? cur_sample_ : sample;
  at::Tensor prev = prev_sample(cur, t_base, prev_t, model_output);
  ++counter_;
  return prev;
}

at::Tensor PNDMScheduler::step_plms(const at::Tensor& model_output_in, int64_t t, const at::Tensor& sample_in) {
  SD_CHECK(config_.skip_prk_steps || ets_.size() >= 3,
           "{}: PLMS steps need the 12 Runge-Kutta warm-up steps first (skip_prk_steps is false)", class_name());
  const int64_t step = config_.num_train_timesteps / num_inference_steps_;
  int64_t prev_t = t - step;
  if (counter_ != 1) {
    if (ets_.size() > 3) ets_.erase(ets_.begin(), ets_.end() - 3);
    ets_.push_back(model_output_in);
  } else {
    // The repeated second timestep: this call completes the first step from the saved sample.
    prev_t = t;
    t = t + step;
  }

  at::Tensor model_output = model_output_in;
  at::Tensor sample = sample_in;
  const size_t n = ets_.size();
  if (n == 1 && counter_ == 0) {
    cur_sample_ = sample;
  } else if (n == 1 && counter_ == 1) {
    model_output = (model_output + ets_[0]) / 2;
    sample = cur_sample_;
    cur_sample_ = at::Tensor();
  } else if (n == 2) {
    model_output = (3 * ets_[1] - ets_[0]) / 2;
  } else if (n == 3) {
    model_output = (23 * ets_[2] - 16 * ets_[1] + 5 * ets_[0]) / 12;
  } else {
    // Adams-Bashforth 4.
    model_output = (1.0 / 24) * (55 * ets_[n - 1] - 59 * ets_[n - 2] + 37 * ets_[n - 3] - 9 * ets_[n - 4]);
  }
  at::Tensor prev = prev_sample(sample, t, prev_t, model_output);
  ++counter_;
  return prev;
}

at::Tensor PNDMScheduler::prev_sample(const at::Tensor& sample, int64_t t, int64_t prev_t,
                                      at::Tensor model_output) const {
  SD_CHECK(t >= 0 && t < config_.num_train_timesteps, "{}: timestep {} outside [0, {})", class_name(), t,
           config_.num_train_timesteps);
  // PNDM paper eq. 9: x_{t-d} from x_t and eps.
  const at::Tensor alpha_prod_t = alphas_cumprod_[t];
  const at::Tensor alpha_prod_t_prev = prev_t >= 0 ? alphas_cumprod_[prev_t] : final_alpha_cumprod_;
  const at::Tensor beta_prod_t = 1 - alpha_prod_t;
  const at::Tensor beta_prod_t_prev = 1 - alpha_prod_t_prev;
  if (config_.prediction_type == "v_prediction")
    model_output = alpha_prod_t.pow(0.5) * model_output + beta_prod_t.pow(0.5) * sample;
  const at::Tensor sample_coeff = (alpha_prod_t_prev / alpha_prod_t).pow(0.5);
  const at::Tensor denom =
      alpha_prod_t * beta_prod_t_prev.pow(0.5) + (alpha_prod_t * beta_prod_t * alpha_prod_t_prev).pow(0.5);
  return sample_coeff * sample - (alpha_prod_t_prev - alpha_prod_t) * model_output / denom;
}

}  // namespace sd::schedulers
