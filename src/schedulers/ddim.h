// DDIMScheduler (diffusers 0.24): the DDIM update, deterministic at eta = 0 (as SD-2 pipelines ship it) and
// stochastic for eta > 0, where eta = 1 gives DDPM's posterior variance.
#pragma once
#include "schedulers/scheduler.h"

namespace sd::schedulers {

class DDIMScheduler : public Scheduler {
 public:
  explicit DDIMScheduler(SchedulerConfig config);
  std::string class_name() const override { return "DDIMScheduler"; }
  void set_timesteps(int num_inference_steps) override;
  // With eta > 0 adds sigma_t(eta) * noise (DDIM paper eq. 16).
  at::Tensor step(const at::Tensor& model_output, const at::Tensor& t, const at::Tensor& sample,
                  Noise noise = {}) override;
  bool step_draws_noise() const override { return eta_ > 0; }

  // diffusers passes eta to every step() (the pipeline's `eta`); here it is a setting of the object. eta must
  // be in [0, 1]: sd::Error otherwise.
  void set_eta(double eta);
  double eta() const { return eta_; }

 private:
  at::Tensor final_alpha_cumprod_;
  bool clip_sample_;
  double eta_ = 0.0;
};

}  // namespace sd::schedulers
