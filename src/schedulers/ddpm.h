// DDPMScheduler (diffusers 0.24): ancestral sampling with the fixed posterior variance, and the training-side
// helper get_velocity that the fine-tuning scripts call on it (add_noise is every scheduler's).
#pragma once
#include "schedulers/scheduler.h"

namespace sd::schedulers {

class DDPMScheduler : public Scheduler {
 public:
  explicit DDPMScheduler(SchedulerConfig config);
  std::string class_name() const override { return "DDPMScheduler"; }
  void set_timesteps(int num_inference_steps) override;
  // Draws noise for every t > 0.
  at::Tensor step(const at::Tensor& model_output, const at::Tensor& t, const at::Tensor& sample,
                  Noise noise = {}) override;
  bool step_draws_noise() const override { return true; }

  at::Tensor get_velocity(const at::Tensor& sample, const at::Tensor& noise, const at::Tensor& timesteps) const {
    return schedulers::get_velocity(alphas_cumprod_, sample, noise, timesteps);
  }

 private:
  int64_t previous_timestep(int64_t t) const;
  at::Tensor alpha_prod_prev(int64_t prev_t) const;
  at::Tensor variance(int64_t t) const;

  std::string variance_type_;
  bool clip_sample_;
  at::Tensor one_;
};

}  // namespace sd::schedulers
