#include "train/adamw.h"

#include <ATen/Parallel.h>
#include <immintrin.h>
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

namespace {

// torch.optim.AdamW's single-tensor update of one element, in its order of float32 operations:
//   p *= 1 - lr*wd;  m = m*b1 + (1-b1)*g;  v = v*b2 + (1-b2)*g*g;  p += -step_size * m / (sqrt(v)/sqrt(bc2) + eps)
struct AdamWCoefficients {
  float grad_scale, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, sqrt_bias_correction2, eps, neg_step_size;
};

float update_one(float& p, float g_raw, float& m, float& v, const AdamWCoefficients& c) {
  const float g = g_raw * c.grad_scale;
  const float param = p * c.decay;
  m = m * c.beta1 + c.one_minus_beta1 * g;
  v = v * c.beta2 + c.one_minus_beta2 * g * g;
  return p = param + c.neg_step_size * (m / (std::sqrt(v) / c.sqrt_bias_correction2 + c.eps));
}

// Eight elements at a time with AVX2 (and its fused multiply-adds, as LibTorch's vector kernels use them); the
// scalar form for the tail and for CPUs without AVX2.
__attribute__((target("avx2,fma"))) void update_range_avx2(float* p, const float* g, float* m, float* v, int64_t begin,
                                                           int64_t end, const AdamWCoefficients& c) {
  const __m256 grad_scale = _mm256_set1_ps(c.grad_scale), decay = _mm256_set1_ps(c.decay),
               beta1 = _mm256_set1_ps(c.beta1), one_minus_beta1 = _mm256_set1_ps(c.one_minus_beta1),
               beta2 = _mm256_set1_ps(c.beta2), one_minus_beta2 = _mm256_set1_ps(c.one_minus_beta2),
               sqrt_bias_correction2 = _mm256_set1_ps(c.sqrt_bias_correction2), eps = _mm256_set1_ps(c.eps),
               neg_step_size = _mm256_set1_ps(c.neg_step_size);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 grad = _mm256_mul_ps(_mm256_loadu_ps(g + i), grad_scale);
    const __m256 param = _mm256_mul_ps(_mm256_loadu_ps(p + i), decay);
    const __m256 m_new = _mm256_fmadd_ps(grad, one_minus_beta1, _mm256_mul_ps(_mm256_loadu_ps(m + i), beta1));
    const __m256 v_new =
        _mm256_fmadd_ps(_mm256_mul_ps(grad, one_minus_beta2), grad, _mm256_mul_ps(_mm256_loadu_ps(v + i), beta2));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v_new), sqrt_bias_correction2), eps);
    _mm256_storeu_ps(m + i, m_new);
    _mm256_storeu_ps(v + i, v_new);
    _mm256_storeu_ps(p + i, _mm256_fmadd_ps(neg_step_size, _mm256_div_ps(m_new, denom), param));
  }
  for (; i < end; ++i) update_one(p[i], g[i], m[i], v[i], c);
}

void update_range(float* p, const float* g, float* m, float* v, int64_t begin, int64_t end,
                  const AdamWCoefficients& c) {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2) return update_range_avx2(p, g, m, v, begin, end, c);
  for (int64_t i = begin; i < end; ++i) update_one(p[i], g[i], m[i], v[i], c);
}

}  // namespace

void AdamW::step(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads, double lr,
                 double grad_scale) {
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
  const AdamWCoefficients c{static_cast<float>(grad_scale),
                            static_cast<float>(1 - lr * options_.weight_decay),
                            static_cast<float>(options_.beta1),
                            static_cast<float>(1 - options_.beta1),
                            static_cast<float>(options_.beta2),
                            static_cast<float>(1 - options_.beta2),
                            static_cast<float>(std::sqrt(bias_correction2)),
                            static_cast<float>(options_.eps),
                            static_cast<float>(-lr / bias_correction1)};
  // One pass over each tensor reading g, p, m, v and writing p, m, v: the optimizer is memory-bound, and LibTorch's
  // op-by-op form reads and writes the same arrays about ten times (see docs/benchmarks.md).
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    const at::Tensor g = grads[i].to(at::kFloat).contiguous();
    SD_CHECK(p.scalar_type() == at::kFloat && p.is_contiguous() && g.numel() == p.numel(),
             "AdamW updates contiguous float32 tensors (parameter {} is {} with {} elements, its gradient {})", i,
             c10::toString(p.scalar_type()), p.numel(), g.numel());
    float* pp = p.data_ptr<float>();
    const float* gp = g.data_ptr<float>();
    float* mp = exp_avg_[i].data_ptr<float>();
    float* vp = exp_avg_sq_[i].data_ptr<float>();
    at::parallel_for(0, p.numel(), 1 << 16,
                     [&](int64_t begin, int64_t end) { update_range(pp, gp, mp, vp, begin, end, c); });
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
