// What diffusers 0.24's multistep solvers share (DPMSolverMultistep, UniPCMultistep): integer timesteps with the
// sigma of each (interpolated, or Karras sigmas), a step index found from the first timestep they see, the
// converted model outputs of the last solver_order steps, and add_noise in the VP form.
#pragma once
#include <string>
#include <vector>

#include "schedulers/scheduler.h"

namespace sd::schedulers {

class MultistepScheduler : public Scheduler {
 public:
  // alpha_t * original + sigma_t * noise at the sigma of each timestep.
  at::Tensor add_noise(const at::Tensor& original, const at::Tensor& noise, const at::Tensor& timesteps) const override;

 protected:
  // `class_name` names the derived class in errors (its class_name() cannot be called while constructing).
  MultistepScheduler(SchedulerConfig config, const std::string& class_name);

  // n timesteps from n + 1 spaced points without the t = 0 end (timesteps must not exceed last_timestep), each
  // with its sigma, plus the sigma the last step lands on: sigma(t = 0), or with Karras sigmas the last one
  // again. Resets the run state.
  void set_table(int num_inference_steps, int64_t last_timestep);
  // diffusers' _init_step_index: the index of t, the last index when t is not in the table.
  void init_step_index(const at::Tensor& t);
  // x0 (data prediction) or epsilon (noise prediction) from the raw model output at this step's sigma.
  at::Tensor data_prediction(const at::Tensor& model_output, const at::Tensor& sample) const;
  at::Tensor noise_prediction(const at::Tensor& model_output, const at::Tensor& sample) const;
  // Appends a converted model output to the history, dropping the oldest.
  void remember(const at::Tensor& converted_output);

  std::vector<at::Tensor> model_outputs_;  // the last solver_order converted outputs, oldest first
  int64_t lower_order_nums_ = 0;           // steps taken so far, capped at solver_order (the warm-up)
  int64_t step_index_ = -1;
};

}  // namespace sd::schedulers
