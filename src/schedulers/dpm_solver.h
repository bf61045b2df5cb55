// DPMSolverMultistepScheduler (diffusers 0.24): DPM-Solver / DPM-Solver++ (and their SDE variants) of order 1-3,
// midpoint or heun second-order form, lower-order final steps for short runs.
#pragma once
#include <vector>

#include "schedulers/scheduler.h"

namespace sd::schedulers {

class DPMSolverMultistepScheduler : public Scheduler {
 public:
  explicit DPMSolverMultistepScheduler(SchedulerConfig config);
  std::string class_name() const override { return "DPMSolverMultistepScheduler"; }
  void set_timesteps(int num_inference_steps) override;
  // Noise is drawn only by the sde-* algorithm types.
  at::Tensor step(const at::Tensor& model_output, const at::Tensor& t, const at::Tensor& sample,
                  Noise noise = {}) override;

 private:
  void init_step_index(const at::Tensor& t);
  // x0 (dpmsolver++) or eps (dpmsolver) from the raw model output.
  at::Tensor convert_model_output(at::Tensor model_output, const at::Tensor& sample) const;
  at::Tensor first_order(const at::Tensor& m0, const at::Tensor& sample, const at::Tensor& noise) const;
  at::Tensor second_order(const at::Tensor& sample, const at::Tensor& noise) const;
  at::Tensor third_order(const at::Tensor& sample) const;

  std::string algorithm_type_, solver_type_;
  at::Tensor lambda_t_;                    // log(alpha_t) - log(sigma_t) per training timestep
  std::vector<at::Tensor> model_outputs_;  // the last solver_order converted outputs, oldest first
  int64_t lower_order_nums_ = 0;
  int64_t step_index_ = -1;
};

}  // namespace sd::schedulers
