// The k-diffusion Euler samplers of diffusers 0.24: EulerDiscreteScheduler (deterministic, s_churn = 0; linear or
// log-linear sigmas, Karras sigmas, continuous timesteps) and EulerAncestralDiscreteScheduler.
#pragma once
#include "schedulers/sigma_scheduler.h"

namespace sd::schedulers {

class EulerDiscreteScheduler : public SigmaScheduler {
 public:
  explicit EulerDiscreteScheduler(SchedulerConfig config);
  std::string class_name() const override { return "EulerDiscreteScheduler"; }
  void set_timesteps(int num_inference_steps) override;
  // diffusers draws a noise tensor every step even though s_churn = 0 leaves it unused; with a generator the
  // draw is made too, so the generator's stream stays where diffusers leaves it.
  at::Tensor step(const at::Tensor& model_output, const at::Tensor& t, const at::Tensor& sample,
                  Noise noise = {}) override;
};

class EulerAncestralDiscreteScheduler : public SigmaScheduler {
 public:
  explicit EulerAncestralDiscreteScheduler(SchedulerConfig config);
  std::string class_name() const override { return "EulerAncestralDiscreteScheduler"; }
  void set_timesteps(int num_inference_steps) override;
  // Euler step to sigma_down, then noise * sigma_up.
  at::Tensor step(const at::Tensor& model_output, const at::Tensor& t, const at::Tensor& sample,
                  Noise noise = {}) override;
  bool step_draws_noise() const override { return true; }
};

}  // namespace sd::schedulers
