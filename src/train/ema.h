// Exponential moving average of the trained weights with diffusers' EMAModel semantics (training_utils.py, 0.24):
// the decay schedule of get_decay (0 at the first update, then (1 + n) / (10 + n) or the warm-up form
// 1 - (1 + n / inv_gamma)^-power, capped at `decay`, floored at `min_decay`) and the update
// shadow -= (1 - decay) * (shadow - param), which AdamW's pass applies (train/adamw.h: AdamWFollowers) so the new
// parameters are not read a second time. Only trained weights have a shadow.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace sd::train {

struct EmaOptions {
  double decay = 0.9999;
  double min_decay = 0.0;
  int64_t update_after_step = 0;
  bool use_warmup = false;
  double inv_gamma = 1.0;
  double power = 2.0 / 3.0;
  void validate() const;
};

// The decay EMAModel.step uses at its `optimization_step`-th call (counted from 1).
double ema_decay(const EmaOptions& options, int64_t optimization_step);

class Ema {
 public:
  // The shadow starts as a copy of `params`.
  Ema(EmaOptions options, const std::vector<at::Tensor>& params);

  // One EMAModel.step: counts the update and returns its 1 - decay, for the caller to move every shadow towards its
  // parameter by.
  float advance();

  int64_t optimization_step() const { return optimization_step_; }
  double last_decay() const { return last_decay_; }
  std::vector<at::Tensor>& shadow() { return shadow_; }
  void set_optimization_step(int64_t step);
  const EmaOptions& options() const { return options_; }

 private:
  EmaOptions options_;
  std::vector<at::Tensor> shadow_;
  int64_t optimization_step_ = 0;
  double last_decay_ = 0.0;
};

}  // namespace sd::train
