// DDIMScheduler (diffusers 0.24) with eta = 0: the deterministic DDIM update, as SD-2 pipelines ship it.
#pragma once
#include "schedulers/scheduler.h"

namespace sd::schedulers {

class DDIMScheduler : public Scheduler {
 public:
  explicit DDIMScheduler(SchedulerConfig config);
  std::string class_name() const override { return "DDIMScheduler"; }
  void set_timesteps(int num_inference_steps) override;
  at::Tensor step(const at::Tensor& model_output, const at::Tensor& t, const at::Tensor& sample,
                  Noise noise = {}) override;

 private:
  at::Tensor final_alpha_cumprod_;
  bool clip_sample_;
};

}  // namespace sd::schedulers
