#include "train/ema.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace sd::train {

void EmaOptions::validate() const {
  SD_CHECK(decay >= 0 && decay <= 1, "--ema_decay must be in [0, 1], got {}", decay);
  SD_CHECK(min_decay >= 0 && min_decay <= decay, "--ema_min_decay must be in [0, --ema_decay], got {}", min_decay);
  SD_CHECK(update_after_step >= 0, "--ema_update_after_step must be >= 0, got {}", update_after_step);
  SD_CHECK(inv_gamma > 0 && std::isfinite(inv_gamma), "--ema_inv_gamma must be positive, got {}", inv_gamma);
  SD_CHECK(power > 0 && std::isfinite(power), "--ema_power must be positive, got {}", power);
}

double ema_decay(const EmaOptions& o, int64_t optimization_step) {
  const int64_t step = std::max<int64_t>(0, optimization_step - o.update_after_step - 1);
  if (step <= 0) return 0.0;
  const auto n = static_cast<double>(step);
  const double value = o.use_warmup ? 1 - std::pow(1 + n / o.inv_gamma, -o.power) : (1 + n) / (10 + n);
  return std::max(std::min(value, o.decay), o.min_decay);
}

Ema::Ema(EmaOptions options, const std::vector<at::Tensor>& params) : options_(options) {
  options_.validate();
  for (const auto& p : params) shadow_.push_back(p.detach().clone());
}

float Ema::advance() {
  optimization_step_ += 1;
  last_decay_ = ema_decay(options_, optimization_step_);
  return static_cast<float>(1 - last_decay_);
}

void Ema::set_optimization_step(int64_t step) {
  SD_CHECK(step >= 0, "EMA state: negative optimization step {}", step);
  optimization_step_ = step;
}

}  // namespace sd::train
