#include "train/ema.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/parallel.h"

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

void Ema::update(const std::vector<at::Tensor>& params) {
  at::NoGradGuard no_grad;
  optimization_step_ += 1;
  last_decay_ = ema_decay(options_, optimization_step_);
  const auto one_minus_decay = static_cast<float>(1 - last_decay_);
  // shadow -= (shadow - param) * (1 - decay), in float32 as diffusers computes it, in one pass per tensor.
  for (size_t i = 0; i < shadow_.size(); ++i) {
    SD_CHECK(shadow_[i].scalar_type() == at::kFloat && shadow_[i].is_contiguous() && params[i].is_contiguous() &&
                 params[i].scalar_type() == at::kFloat,
             "EMA updates contiguous float32 tensors");
    float* s = shadow_[i].data_ptr<float>();
    const float* p = params[i].data_ptr<float>();
    sd::parallel_for(0, shadow_[i].numel(), 1 << 16, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) s[k] -= (s[k] - p[k]) * one_minus_decay;
    });
  }
}

void Ema::set_optimization_step(int64_t step) {
  SD_CHECK(step >= 0, "EMA state: negative optimization step {}", step);
  optimization_step_ = step;
}

}  // namespace sd::train
