#include "schedulers/heun.h"

#include "core/error.h"

namespace sd::schedulers {

namespace {

// [v0, v1, v2, ...] -> [v0, v1, v1, v2, v2, ...]: each value after the first is visited twice.
std::vector<double> repeat_after_first(const std::vector<double>& values) {
  std::vector<double> out{values.front()};
  for (size_t i = 1; i < values.size(); ++i) out.insert(out.end(), {values[i], values[i]});
  return out;
}

}  // namespace

HeunDiscreteScheduler::HeunDiscreteScheduler(SchedulerConfig config)
    : SigmaScheduler(std::move(config), "HeunDiscreteScheduler") {}

void HeunDiscreteScheduler::set_timesteps(int n) {
  check_steps(n);
  num_inference_steps_ = n;
  const auto [schedule, timestep_dtype] = interpolated_or_karras_schedule(n);
  set_tables({repeat_after_first(schedule.timesteps), repeat_after_first(schedule.sigmas)}, timestep_dtype);
  prev_derivative_ = dt_ = sample_ = at::Tensor();
}

at::Tensor HeunDiscreteScheduler::step(const at::Tensor& model_output, const at::Tensor& t, const at::Tensor& sample,
                                       Noise /*deterministic*/) {
  if (step_index_ < 0) init_step_index(t);
  check_can_step();
  const bool first_order = !dt_.defined();
  // The correction evaluates the slope at the sigma the Euler half reached (gamma = 0: sigma_hat = sigma).
  const at::Tensor sigma = first_order ? sigmas_[step_index_] : sigmas_[step_index_ - 1];
  const at::Tensor sigma_next = first_order ? sigmas_[step_index_ + 1] : sigmas_[step_index_];
  at::Tensor pred_original = x0_prediction(model_output, sample, first_order ? sigma : sigma_next);
  if (config_.clip_sample.value_or(false))
    pred_original = pred_original.clamp(-config_.clip_sample_range, config_.clip_sample_range);

  at::Tensor prev;
  if (first_order) {
    prev_derivative_ = (sample - pred_original) / sigma;
    dt_ = sigma_next - sigma;
    sample_ = sample;
    prev = sample + prev_derivative_ * dt_;
  } else {
    const at::Tensor derivative = ((sample - pred_original) / sigma_next + prev_derivative_) / 2;
    prev = sample_ + derivative * dt_;
    prev_derivative_ = dt_ = sample_ = at::Tensor();
  }
  ++step_index_;
  return prev;
}

}  // namespace sd::schedulers
