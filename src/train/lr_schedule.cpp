#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace sd::train {

namespace {
const char* kNames[] = {"linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup"};

double warmup(const LrSchedule& s, int64_t step) {
  return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, s.warmup_steps));
}

double progress(const LrSchedule& s, int64_t step) {
  return static_cast<double>(step - s.warmup_steps) /
         static_cast<double>(std::max<int64_t>(1, s.total_steps - s.warmup_steps));
}
}  // namespace

void validate(const LrSchedule& schedule) {
  for (const char* name : kNames)
    if (schedule.name == name) return;
  fail(
      "--lr_scheduler: unknown schedule '{}' (expected one of linear, cosine, cosine_with_restarts, polynomial, "
      "constant, constant_with_warmup)",
      schedule.name);
}

double lr_multiplier(const LrSchedule& s, int64_t step, double base_lr) {
  const double pi = 3.14159265358979323846;
  if (s.name == "constant") return 1.0;
  if (step < s.warmup_steps) return warmup(s, step);
  if (s.name == "constant_with_warmup") return 1.0;
  if (s.name == "linear")
    return std::max(0.0, static_cast<double>(s.total_steps - step) /
                             static_cast<double>(std::max<int64_t>(1, s.total_steps - s.warmup_steps)));
  if (s.name == "cosine") return std::max(0.0, 0.5 * (1.0 + std::cos(pi * s.cosine_cycles * 2.0 * progress(s, step))));
  if (s.name == "cosine_with_restarts") {
    const double p = progress(s, step);
    if (p >= 1.0) return 0.0;
    return std::max(0.0, 0.5 * (1.0 + std::cos(pi * std::fmod(static_cast<double>(s.num_cycles) * p, 1.0))));
  }
  if (s.name == "polynomial") {
    SD_CHECK(base_lr > s.polynomial_lr_end,
             "polynomial schedule: lr_end ({}) must be smaller than the learning rate ({})", s.polynomial_lr_end,
             base_lr);
    if (step > s.total_steps) return s.polynomial_lr_end / base_lr;
    const double range = base_lr - s.polynomial_lr_end;
    const double remaining =
        1.0 - static_cast<double>(step - s.warmup_steps) / static_cast<double>(s.total_steps - s.warmup_steps);
    return (range * std::pow(remaining, s.polynomial_power) + s.polynomial_lr_end) / base_lr;
  }
  validate(s);
  return 1.0;
}

}  // namespace sd::train
