#include "schedulers/sigmas.h"

#include <algorithm>
#include <cmath>

#include "schedulers/numpy_compat.h"

namespace sd::schedulers {

std::vector<double> training_sigmas(const at::Tensor& alphas_cumprod) {
  return to_doubles(((1 - alphas_cumprod) / alphas_cumprod).pow(0.5));
}

std::vector<double> karras_sigmas(double sigma_min, double sigma_max, int64_t n) {
  constexpr double rho = 7.0;  // the paper's choice
  const double min_inv_rho = std::pow(sigma_min, 1 / rho);
  const double max_inv_rho = std::pow(sigma_max, 1 / rho);
  std::vector<double> sigmas;
  for (double ramp : np::linspace(0, 1, n))
    sigmas.push_back(std::pow(max_inv_rho + ramp * (min_inv_rho - max_inv_rho), rho));
  return sigmas;
}

std::vector<double> sigmas_to_timesteps(const std::vector<double>& sigmas, const std::vector<double>& training_sigmas) {
  // diffusers keeps log sigma of the table in float32, and numpy's promotion rules then carry out the comparison
  // and the interpolation weight in float32 as well; only the final blend of the two indices is float64.
  std::vector<float> log_table;
  for (double s : training_sigmas) log_table.push_back(std::log(static_cast<float>(s)));
  const auto last_low = static_cast<int64_t>(log_table.size()) - 2;
  std::vector<double> timesteps;
  for (double sigma : sigmas) {
    const auto log_sigma = static_cast<float>(std::log(std::max(sigma, 1e-10)));
    // log_table ascends with t: `low` is the last training timestep at or below sigma.
    const auto at_or_below = std::upper_bound(log_table.begin(), log_table.end(), log_sigma) - log_table.begin();
    const int64_t low = std::min<int64_t>(std::max<int64_t>(at_or_below - 1, 0), last_low);
    const float low_log = log_table[low], high_log = log_table[low + 1];
    const float w = std::clamp((low_log - log_sigma) / (low_log - high_log), 0.0f, 1.0f);
    timesteps.push_back(static_cast<double>(1.0f - w) * static_cast<double>(low) +
                        static_cast<double>(w) * static_cast<double>(low + 1));
  }
  return timesteps;
}

std::pair<at::Tensor, at::Tensor> alpha_sigma(const at::Tensor& sigma) {
  const at::Tensor alpha_t = 1 / (sigma.pow(2) + 1).pow(0.5);
  return {alpha_t, sigma * alpha_t};
}

at::Tensor lambda_of(const at::Tensor& alpha_t, const at::Tensor& sigma_t) {
  return at::log(alpha_t) - at::log(sigma_t);
}

at::Tensor to_tensor(const std::vector<double>& values, at::ScalarType dtype) {
  return at::tensor(at::ArrayRef<double>(values), at::kDouble).to(dtype);
}

std::vector<double> to_doubles(const at::Tensor& values) {
  const at::Tensor d = values.to(at::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

}  // namespace sd::schedulers
