// HeunDiscreteScheduler (diffusers 0.24): Heun's second-order method (Karras et al. 2022, Algorithm 1 with
// s_churn = 0) on k-diffusion's sigma ODE. Every timestep but the first appears twice in the table: an Euler step
// to the next sigma, then a model call there that corrects it with the average of the two slopes.
#pragma once
#include "schedulers/sigma_scheduler.h"

namespace sd::schedulers {

class HeunDiscreteScheduler : public SigmaScheduler {
 public:
  explicit HeunDiscreteScheduler(SchedulerConfig config);
  std::string class_name() const override { return "HeunDiscreteScheduler"; }
  int order() const override { return 2; }
  void set_timesteps(int num_inference_steps) override;
  at::Tensor step(const at::Tensor& model_output, const at::Tensor& t, const at::Tensor& sample,
                  Noise noise = {}) override;

 private:
  // The first-order half of a step waiting for its correction (undefined between steps).
  at::Tensor prev_derivative_, dt_, sample_;
};

}  // namespace sd::schedulers
