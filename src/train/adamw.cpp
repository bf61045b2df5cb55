#include "train/adamw.h"

#include <ATen/core/grad_mode.h>

#include <cmath>

#include "core/error.h"

namespace sd::train {

void AdamWOptions::validate() const {
  SD_CHECK(beta1 >= 0 && beta1 < 1, "--adam_beta1 must be in [0, 1), got {}", beta1);
  SD_CHECK(beta2 >= 0 && beta2 < 1, "--adam_beta2 must be in [0, 1), got {}", beta2);
  SD_CHECK(eps >= 0 && std::isfinite(eps), "--adam_epsilon must be a finite number >= 0, got {}", eps);
  SD_CHECK(weight_decay >= 0 && std::isfinite(weight_decay), "--adam_weight_decay must be a finite number >= 0, got {}",
           weight_decay);
}

AdamW::AdamW(AdamWOptions options) : options_(options) { options_.validate(); }

void AdamW::step(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads, double lr) {
  SD_CHECK(params.size() == grads.size(), "AdamW: {} parameters but {} gradients", params.size(), grads.size());
  at::NoGradGuard no_grad;
  if (exp_avg_.empty()) {
    for (const auto& p : params) {
      exp_avg_.push_back(at::zeros_like(p));
      exp_avg_sq_.push_back(at::zeros_like(p));
    }
  }
  SD_CHECK(exp_avg_.size() == params.size(), "AdamW: state for {} parameters, given {}", exp_avg_.size(),
           params.size());
  steps_ += 1;
  const double bias_correction1 = 1 - std::pow(options_.beta1, static_cast<double>(steps_));
  const double bias_correction2 = 1 - std::pow(options_.beta2, static_cast<double>(steps_));
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    const at::Tensor& grad = grads[i];
    p.mul_(1 - lr * options_.weight_decay);
    exp_avg_[i].mul_(options_.beta1).add_(grad, 1 - options_.beta1);
    exp_avg_sq_[i].mul_(options_.beta2).addcmul_(grad, grad, 1 - options_.beta2);
    const at::Tensor denom = (exp_avg_sq_[i].sqrt() / std::sqrt(bias_correction2)).add_(options_.eps);
    p.addcdiv_(exp_avg_[i], denom, -lr / bias_correction1);
  }
}

void AdamW::set_state(std::vector<at::Tensor> exp_avg, std::vector<at::Tensor> exp_avg_sq, int64_t steps) {
  SD_CHECK(exp_avg.size() == exp_avg_sq.size(), "AdamW state: {} first moments but {} second moments", exp_avg.size(),
           exp_avg_sq.size());
  SD_CHECK(steps >= 0, "AdamW state: negative step count {}", steps);
  exp_avg_ = std::move(exp_avg);
  exp_avg_sq_ = std::move(exp_avg_sq);
  steps_ = steps;
}

}  // namespace sd::train
