// What diffusers 0.24's k-diffusion samplers share (EulerDiscrete, EulerAncestralDiscrete, HeunDiscrete,
// LMSDiscrete): they step in sigma rather than alpha_cumprod, take float timesteps, scale the model input by
// 1 / sqrt(sigma^2 + 1), and find their place in the table from the first timestep they are given.
#pragma once
#include <utility>
#include <vector>

#include "schedulers/scheduler.h"

namespace sd::schedulers {

class SigmaScheduler : public Scheduler {
 public:
  // `class_name` names the derived class in errors (its class_name() cannot be called while constructing).
  SigmaScheduler(SchedulerConfig config, const std::string& class_name);
  // sigma_max, or sqrt(sigma_max^2 + 1) for leading spacing (as diffusers).
  double init_noise_sigma() const override;
  // sample / sqrt(sigma^2 + 1).
  at::Tensor scale_model_input(const at::Tensor& sample, const at::Tensor& t) override;
  // original + noise * sigma(t): the forward process in sigma.
  at::Tensor add_noise(const at::Tensor& original, const at::Tensor& noise, const at::Tensor& timesteps) const override;

 protected:
  // A table of timesteps with the sigma at each.
  struct Schedule {
    std::vector<double> timesteps, sigmas;
  };
  // The timesteps of timestep_spacing (float32 values, fractional for linspace) and the training sigmas linearly
  // interpolated at them.
  Schedule interpolated_schedule(int num_inference_steps) const;
  // The same number of Karras sigmas from sigma_max down to sigma_min, with the fractional timesteps they fall on.
  Schedule karras_schedule(int num_inference_steps, double sigma_min, double sigma_max) const;
  // Heun's and LMS's table: interpolated_schedule, or with use_karras_sigmas the Karras sigmas over its range, whose
  // timesteps stay float64 (diffusers casts them to float32 only in EulerDiscreteScheduler).
  std::pair<Schedule, at::ScalarType> interpolated_or_karras_schedule(int num_inference_steps) const;
  // timesteps_ in `timestep_dtype` and sigmas_ = schedule.sigmas + [0] in float32; resets the step index.
  void set_tables(const Schedule& schedule, at::ScalarType timestep_dtype);

  // diffusers' _init_step_index: the index of t in the table on the first scale_model_input or step.
  void init_step_index(const at::Tensor& t);
  // x0 from the model output at noise level `sigma`: epsilon, v (k-diffusion's c_out / c_skip) or the sample.
  at::Tensor x0_prediction(const at::Tensor& model_output, const at::Tensor& sample, const at::Tensor& sigma) const;
  // Throws unless set_timesteps ran and the step index has a next sigma.
  void check_can_step() const;

  int64_t step_index_ = -1;
};

}  // namespace sd::schedulers
