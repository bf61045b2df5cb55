// LMSDiscreteScheduler (diffusers 0.24): k-diffusion's linear multistep sampler. Each step integrates the
// Lagrange polynomial through the last (up to 4) ODE slopes over the interval to the next sigma.
#pragma once
#include <deque>

#include "schedulers/sigma_scheduler.h"

namespace sd::schedulers {

class LMSDiscreteScheduler : public SigmaScheduler {
 public:
  explicit LMSDiscreteScheduler(SchedulerConfig config);
  std::string class_name() const override { return "LMSDiscreteScheduler"; }
  void set_timesteps(int num_inference_steps) override;
  at::Tensor step(const at::Tensor& model_output, const at::Tensor& t, const at::Tensor& sample,
                  Noise noise = {}) override;

  // The weight of the slope `current_order` steps back: the integral from sigma[step] to sigma[step + 1] of
  // the Lagrange basis polynomial through sigma[step], ..., sigma[step - order + 1] that is 1 at that slope's
  // sigma (diffusers' get_lms_coefficient).
  double lms_coefficient(int order, int64_t step, int current_order) const;

 private:
  static constexpr int kOrder = 4;      // diffusers' step() default
  std::deque<at::Tensor> derivatives_;  // the last kOrder slopes, oldest first
};

}  // namespace sd::schedulers
