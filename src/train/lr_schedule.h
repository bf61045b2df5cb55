// Learning-rate schedules of diffusers.optimization.get_scheduler, as multipliers of the base learning rate.
#pragma once
#include <cstdint>
#include <string>

namespace sd::train {

struct LrSchedule {
  std::string name = "constant";  // linear, cosine, cosine_with_restarts, polynomial, constant, constant_with_warmup
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  int64_t num_cycles = 1;      // cosine_with_restarts: hard restarts; cosine: see cosine_cycles
  double cosine_cycles = 0.5;  // diffusers' cosine default: half a cosine wave from 1 to 0
  double polynomial_power = 1.0;
  double polynomial_lr_end = 1e-7;
};

// Throws sd::Error for an unknown schedule name (the message lists the valid ones).
void validate(const LrSchedule& schedule);

// The multiplier LambdaLR applies at optimizer step `step` (0 for the first step).
double lr_multiplier(const LrSchedule& schedule, int64_t step, double base_lr);

}  // namespace sd::train
