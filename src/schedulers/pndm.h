// PNDMScheduler (diffusers 0.24): pseudo linear multi-step (PLMS). With skip_prk_steps (SD's setting) the second
// timestep repeats, so a run of n steps makes n + 1 model calls; without it, 12 Runge-Kutta calls warm up first.
#pragma once
#include <vector>

#include "schedulers/scheduler.h"

namespace sd::schedulers {

class PNDMScheduler : public Scheduler {
 public:
  explicit PNDMScheduler(SchedulerConfig config);
  std::string class_name() const override { return "PNDMScheduler"; }
  void set_timesteps(int num_inference_steps) override;
  at::Tensor step(const at::Tensor& model_output, const at::Tensor& t, const at::Tensor& sample,
                  Noise noise = {}) override;

 private:
  at::Tensor step_prk(const at::Tensor& model_output, int64_t t, const at::Tensor& sample);
  at::Tensor step_plms(const at::Tensor& model_output, int64_t t, const at::Tensor& sample);
  at::Tensor prev_sample(const at::Tensor& sample, int64_t t, int64_t prev_t, at::Tensor model_output) const;

  static constexpr int kOrder = 4;
  at::Tensor final_alpha_cumprod_;
  std::vector<int64_t> prk_timesteps_;
  // Running state of one sampling run.
  std::vector<at::Tensor> ets_;  // past model outputs (at most 4 kept)
  at::Tensor cur_model_output_;  // PRK accumulator
  at::Tensor cur_sample_;
  int64_t counter_ = 0;
};

}  // namespace sd::schedulers
