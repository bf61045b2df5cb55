#include "train/adamw.h"

#include <ATen/core/grad_mode.h>

#include <cmath>

#include "core/error.h"

namespace sd::train {

AdamW::AdamW(std::vector<at::Tensor> params, AdamWOptions options)
    : params_(std::move(params)), state_(params_.size()), options_(options) {}

void AdamW::step(double lr) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];
    if (!p.grad().defined()) continue;
    const at::Tensor& grad = p.grad();
    ParamState& s = state_[i];
    if (!s.exp_avg.defined()) {
      s.exp_avg = at::zeros_like(p);
      s.exp_avg_sq = at::zeros_like(p);
    }
    s.step += 1;
    p.mul_(1 - lr * options_.weight_decay);
    s.exp_avg.mul_(options_.beta1).add_(grad, 1 - options_.beta1);
    s.exp_avg_sq.mul_(options_.beta2).addcmul_(grad, grad, 1 - options_.beta2);
    const double bias_correction1 = 1 - std::pow(options_.beta1, static_cast<double>(s.step));
    const double bias_correction2 = 1 - std::pow(options_.beta2, static_cast<double>(s.step));
    const at::Tensor denom = (s.exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(options_.eps);
    p.addcdiv_(s.exp_avg, denom, -lr / bias_correction1);
  }
}

void AdamW::zero_grad() {
  for (auto& p : params_)
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
}

io::TensorMap AdamW::state() const {
  io::TensorMap out;
  for (size_t i = 0; i < state_.size(); ++i) {
    if (!state_[i].exp_avg.defined()) continue;
    out[fmt::format("{}.exp_avg", i)] = state_[i].exp_avg;
    out[fmt::format("{}.exp_avg_sq", i)] = state_[i].exp_avg_sq;
    out[fmt::format("{}.step", i)] = at::tensor(state_[i].step, at::kLong);
  }
  return out;
}

void AdamW::load_state(const io::TensorMap& state, const std::string& source) {
  for (size_t i = 0; i < state_.size(); ++i) {
    const std::string key = fmt::format("{}.exp_avg", i);
    if (!state.count(key)) continue;
    const at::Tensor& m = state.at(key);
    const at::Tensor& v = state.at(fmt::format("{}.exp_avg_sq", i));
    SD_CHECK(m.sizes() == params_[i].sizes() && v.sizes() == params_[i].sizes(),
             "{}: optimizer state for parameter {} has shape [{}], the parameter [{}]", source, i,
             fmt::join(m.sizes(), ", "), fmt::join(params_[i].sizes(), ", "));
    state_[i].exp_avg = m.to(params_[i].options()).clone();
    state_[i].exp_avg_sq = v.to(params_[i].options()).clone();
    state_[i].step = state.at(fmt::format("{}.step", i)).item<int64_t>();
  }
}

}  // namespace sd::train
