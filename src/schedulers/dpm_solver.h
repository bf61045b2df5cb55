// DPMSolverMultistepScheduler (diffusers 0.24): DPM-Solver / DPM-Solver++ (and their SDE variants) of order 1-3,
// midpoint or heun second-order form, lower-order final steps for short runs, optionally on Karras sigmas
// ("DPM++ 2M Karras").
#pragma once
#include "schedulers/multistep_scheduler.h"

namespace sd::schedulers {

class DPMSolverMultistepScheduler : public MultistepScheduler {
 public:
  explicit DPMSolverMultistepScheduler(SchedulerConfig config);
  std::string class_name() const override { return "DPMSolverMultistepScheduler"; }
  void set_timesteps(int num_inference_steps) override;
  // Noise is drawn only by the sde-* algorithm types.
  at::Tensor step(const at::Tensor& model_output, const at::Tensor& t, const at::Tensor& sample,
                  Noise noise = {}) override;
  bool step_draws_noise() const override { return algorithm_type_.rfind("sde-", 0) == 0; }

 private:
  // x0 (dpmsolver++) or eps (dpmsolver) from the raw model output.
  at::Tensor convert_model_output(at::Tensor model_output, const at::Tensor& sample) const;
  at::Tensor first_order(const at::Tensor& m0, const at::Tensor& sample, const at::Tensor& noise) const;
  at::Tensor second_order(const at::Tensor& sample, const at::Tensor& noise) const;
  at::Tensor third_order(const at::Tensor& sample) const;

  std::string algorithm_type_, solver_type_;
  at::Tensor lambda_t_;  // log(alpha_t) - log(sigma_t) per training timestep
};

}  // namespace sd::schedulers
