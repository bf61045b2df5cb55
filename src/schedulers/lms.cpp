#include "schedulers/lms.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "schedulers/sigmas.h"

namespace sd::schedulers {

namespace {

// The integral of f over [a, b] by 3-point Gauss-Legendre quadrature, exact for polynomials up to degree 5.
// (diffusers calls scipy's adaptive quad with epsrel 1e-4 on the same polynomial, of degree 3 at most.)
template <typename F>
double gauss_legendre_3(F f, double a, double b) {
  const double half = (b - a) / 2, mid = (a + b) / 2;
  const double node = std::sqrt(3.0 / 5.0);
  return half * (5.0 / 9.0 * f(mid - half * node) + 8.0 / 9.0 * f(mid) + 5.0 / 9.0 * f(mid + half * node));
}

}  // namespace

LMSDiscreteScheduler::LMSDiscreteScheduler(SchedulerConfig config)
    : SigmaScheduler(std::move(config), "LMSDiscreteScheduler") {}

void LMSDiscreteScheduler::set_timesteps(int n) {
  check_steps(n);
  num_inference_steps_ = n;
  const auto [schedule, timestep_dtype] = interpolated_or_karras_schedule(n);
  set_tables(schedule, timestep_dtype);
  derivatives_.clear();
}

double LMSDiscreteScheduler::lms_coefficient(int order, int64_t step, int current_order) const {
  const std::vector<double> sigmas = to_doubles(sigmas_);
  const auto lagrange_basis = [&](double tau) {
    double product = 1.0;
    for (int k = 0; k < order; ++k) {
      if (k == current_order) continue;
      product *= (tau - sigmas[step - k]) / (sigmas[step - current_order] - sigmas[step - k]);
    }
    return product;
  };
  return gauss_legendre_3(lagrange_basis, sigmas[step], sigmas[step + 1]);
}

at::Tensor LMSDiscreteScheduler::step(const at::Tensor& model_output, const at::Tensor& t, const at::Tensor& sample,
                                      Noise /*deterministic*/) {
  if (step_index_ < 0) init_step_index(t);
  check_can_step();
  const at::Tensor sigma = sigmas_[step_index_];
  const at::Tensor pred_original = x0_prediction(model_output, sample, sigma);
  derivatives_.push_back((sample - pred_original) / sigma);
  if (static_cast<int>(derivatives_.size()) > kOrder) derivatives_.pop_front();

  // The order follows the step index, not the slopes held: a run started mid-table (img2img) computes
  // higher-order weights but, like diffusers' zip, uses only as many as it has slopes.
  const int order = static_cast<int>(std::min<int64_t>(step_index_ + 1, kOrder));
  at::Tensor update = at::zeros_like(sample);
  for (int j = 0; j < order && j < static_cast<int>(derivatives_.size()); ++j)
    update = update + lms_coefficient(order, step_index_, j) * derivatives_.rbegin()[j];
  pred_original_sample_ = pred_original;
  ++step_index_;
  return sample + update;
}

}  // namespace sd::schedulers
