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

at::Tensor Scheduler::add_noise(const at::Tensor& original, const at::Tensor& noise,
                                const at::Tensor& timesteps) const {
  return schedulers::add_noise(alphas_cumprod_, original, noise, timesteps);
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

at::Tensor broadcast_per_sample(at::Tensor values, const at::Tensor& like) {
  values = values.flatten();
  while (values.dim() < like.dim()) values = values.unsqueeze(-1);
  return values;
}

namespace {

std::pair<at::Tensor, at::Tensor> sqrt_alpha_terms(const at::Tensor& alphas_cumprod, const at::Tensor& like,
                                                   const at::Tensor& timesteps) {
  const at::Tensor acp = alphas_cumprod.to(like.device(), like.scalar_type());
  const at::Tensor t = timesteps.to(like.device()).to(at::kLong);
  const at::Tensor acp_t = acp.index({t});
  return {broadcast_per_sample(acp_t.pow(0.5), like), broadcast_per_sample((1 - acp_t).pow(0.5), like)};
}

}  // namespace

at::Tensor add_noise(const at::Tensor& alphas_cumprod, const at::Tensor& original, const at::Tensor& noise,
                     const at::Tensor& timesteps) {
  auto [sqrt_alpha, sqrt_one_minus_alpha] = sqrt_alpha_terms(alphas_cumprod, original, timesteps);
  return sqrt_alpha * original + sqrt_one_minus_alpha * noise;
}

at::Tensor get_velocity(const at::Tensor& alphas_cumprod, const at::Tensor& sample, const at::Tensor& noise,
                        const at::Tensor& timesteps) {
  auto [sqrt_alpha, sqrt_one_minus_alpha] = sqrt_alpha_terms(alphas_cumprod, sample, timesteps);
  return sqrt_alpha * noise - sqrt_one_minus_alpha * sample;
}

std::optional<int64_t> index_of_timestep(const at::Tensor& timesteps, const at::Tensor& t) {
  const at::Tensor matches = (timesteps == t.to(timesteps.device())).nonzero();
  if (matches.size(0) == 0) return std::nullopt;
  return matches[matches.size(0) > 1 ? 1 : 0][0].item<int64_t>();
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
