// The k-diffusion style Euler samplers of diffusers 0.24, which work on sigma = sqrt((1 - acp) / acp) and take
// float timesteps: EulerDiscreteScheduler (deterministic, s_churn = 0) and EulerAncestralDiscreteScheduler.
#pragma once
#include "schedulers/scheduler.h"

namespace sd::schedulers {

// What the two Euler schedulers share: the sigma table, init_noise_sigma, scale_model_input, the step index.
class EulerSchedulerBase : public Scheduler {
 public:
  explicit EulerSchedulerBase(SchedulerConfig config);
  void set_timesteps(int num_inference_steps) override;
  // sigma_max, or sqrt(sigma_max^2 + 1) for leading spacing (as diffusers).
  double init_noise_sigma() const override;
  // sample / sqrt(sigma^2 + 1).
  at::Tensor scale_model_input(const at::Tensor& sample, const at::Tensor& t) override;

 protected:
  // The index of `t` in the table on first use (the second match when t repeats, like diffusers).
  void init_step_index(const at::Tensor& t);
  at::Tensor x0_prediction(const at::Tensor& model_output, const at::Tensor& sample, const at::Tensor& sigma) const;

  // interpolation_type and timestep_type exist only in EulerDiscreteScheduler (0.24); EulerAncestral ignores them.
  bool discrete_options_ = false;
  int64_t step_index_ = -1;
};

class EulerDiscreteScheduler : public EulerSchedulerBase {
 public:
  explicit EulerDiscreteScheduler(SchedulerConfig config);
  std::string class_name() const override { return "EulerDiscreteScheduler"; }
  // diffusers draws a noise tensor every step even though s_churn = 0 leaves it unused; with a generator the
  // draw is made too, so the generator's stream stays where diffusers leaves it.
  at::Tensor step(const at::Tensor& model_output, const at::Tensor& t, const at::Tensor& sample,
                  Noise noise = {}) override;
};

class EulerAncestralDiscreteScheduler : public EulerSchedulerBase {
 public:
  explicit EulerAncestralDiscreteScheduler(SchedulerConfig config);
  std::string class_name() const override { return "EulerAncestralDiscreteScheduler"; }
  // Euler step to sigma_down, then noise * sigma_up.
  at::Tensor step(const at::Tensor& model_output, const at::Tensor& t, const at::Tensor& sample,
                  Noise noise = {}) override;
};

}  // namespace sd::schedulers
