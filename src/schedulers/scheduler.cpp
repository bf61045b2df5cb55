#include "schedulers/scheduler.h"

#include "core/error.h"
#include "schedulers/numpy_compat.h"

namespace sd::schedulers {

at::Tensor Noise::draw(const at::Tensor& like) const {
  if (tensor_.defined()) {
    SD_CHECK(tensor_.sizes() == like.sizes(), "scheduler noise: expected shape {}, got {}", c10::str(like.sizes()),
             c10::str(tensor_.sizes()));
    return tensor_.to(like.options());
  }
  if (generator_) return at::randn(like.sizes(), *generator_, like.options());
  return at::randn(like.sizes(), like.options());
}

void Scheduler::check_steps(int num_inference_steps) const {
  SD_CHECK(num_inference_steps >= 1, "{}: num_inference_steps must be >= 1, got {}", class_name(), num_inference_steps);
  SD_CHECK(num_inference_steps <= config_.num_train_timesteps,
           "{}: num_inference_steps ({}) cannot exceed num_train_timesteps ({}) of {}", class_name(),
           num_inference_steps, config_.num_train_timesteps, config_.source);
}

void Scheduler::init_tables(const at::Tensor& betas) {
  betas_ = betas;
  alphas_cumprod_ = at::cumprod(1.0 - betas_, 0);
}

std::vector<double> spaced_timesteps(const std::string& spacing, int64_t num_train_timesteps, int64_t n,
                                     int64_t steps_offset, bool round_linspace) {
  const auto T = static_cast<double>(num_train_timesteps);
  std::vector<double> t;
  if (spacing == "linspace") {
    t = np::linspace(0, T - 1, n);
    if (round_linspace) t = np::round(std::move(t));
    return np::reversed(std::move(t));
  }
  if (spacing == "leading") {
    // Integer step ratio; the offset shifts the table off 0 (SD uses steps_offset 1: 1, 101, ..., 901).
    const int64_t step_ratio = num_train_timesteps / n;
    for (int64_t i = n - 1; i >= 0; --i) t.push_back(static_cast<double>(i * step_ratio + steps_offset));
    return t;
  }
  if (spacing == "trailing") {
    t = np::round(np::arange(T, 0, -(T / static_cast<double>(n))));
    for (double& v : t) v -= 1;
    return t;
  }
  fail("unknown timestep_spacing \"{}\"", spacing);
}

}  // namespace sd::schedulers
