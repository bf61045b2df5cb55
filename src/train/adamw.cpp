#include "train/adamw.h"

#include <ATen/core/grad_mode.h>
#include <cmath>
#include <cstdint>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/kernel_call.h"
#include "core/parallel.h"
#include "core/simd.h"

namespace sd::train {

void AdamWOptions::validate() const {
  SD_CHECK(beta1 >= 0 && beta1 < 1, "--adam_beta1 must be in [0, 1), got {}", beta1);
  SD_CHECK(beta2 >= 0 && beta2 < 1, "--adam_beta2 must be in [0, 1), got {}", beta2);
  // torch accepts 0, but then an element whose gradient is 0 so far (an unused weight, a zero-initialised layer)
  // updates by 0/0 and turns the model NaN.
  SD_CHECK(eps > 0 && std::isfinite(eps),
           "--adam_epsilon must be a finite number > 0 (0 divides 0 by 0 where a gradient is 0), got {}", eps);
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

// One range's pointers into what the pass writes besides p, m and v; null where the step does not write it.
struct RangeFollowers {
  uint16_t* rounded;  // bf16 bits
  float* shadow;
  float one_minus_decay;
};

#define SD_KERNELS "train/adamw_rows.inl"
#include "core/simd_each_width.inl"

// The same update one element at a time, for CPUs without AVX2 (no fused multiply-adds, so the last bits may differ).
float widened(float g) { return g; }
float widened(uint16_t bits) { return static_cast<float>(c10::BFloat16(bits, c10::BFloat16::from_bits())); }

template <typename Grad>
void adamw_range_scalar(float* p, const Grad* g, float* m, float* v, const RangeFollowers& f, int64_t begin,
                        int64_t end, const AdamWCoefficients& c) {
  for (int64_t i = begin; i < end; ++i) {
    const float grad = widened(g[i]) * c.grad_scale;
    const float param = p[i] * c.decay;
    m[i] = m[i] * c.beta1 + c.one_minus_beta1 * grad;
    v[i] = v[i] * c.beta2 + c.one_minus_beta2 * grad * grad;
    p[i] = param + c.neg_step_size * (m[i] / (std::sqrt(v[i]) / c.sqrt_bias_correction2 + c.eps));
    if (f.rounded) f.rounded[i] = c10::BFloat16(p[i]).x;
    if (f.shadow) {
      float step = (f.shadow[i] - p[i]) * f.one_minus_decay;
      asm("" : "+x"(step));  // two roundings, as torch makes them, wherever the compiler could fuse them
      f.shadow[i] -= step;
    }
  }
}

template <typename Grad>
void update_range(float* p, const Grad* g, float* m, float* v, const RangeFollowers& f, int64_t begin, int64_t end,
                  const AdamWCoefficients& c) {
  if (sd::cpu_has_avx2_fma())
    SD_CALL_KERNEL(adamw_range, p, g, m, v, f, begin, end, c);
  else
    adamw_range_scalar(p, g, m, v, f, begin, end, c);
}

}  // namespace

void AdamW::step(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads, double lr,
                 double grad_scale, const AdamWFollowers& followers) {
  std::vector<FlatPieces> whole;
  for (const at::Tensor& g : grads) whole.push_back({{0, g.reshape({-1})}});
  step(params, whole, lr, grad_scale, followers);
}

namespace {

// Everything step() relies on, checked before any parameter changes.
void check_step_arguments(const std::vector<at::Tensor>& params, const std::vector<FlatPieces>& grads,
                          const AdamWFollowers& followers) {
  const auto& rounded_copies = followers.rounded_copies;
  const auto& shadows = followers.ema_shadows;
  SD_CHECK(params.size() == grads.size(), "AdamW: {} parameters but {} gradients", params.size(), grads.size());
  SD_CHECK(rounded_copies.empty() || rounded_copies.size() == params.size(), "AdamW: {} parameters but {} copies",
           params.size(), rounded_copies.size());
  SD_CHECK(shadows.empty() || shadows.size() == params.size(), "AdamW: {} parameters but {} EMA shadows", params.size(),
           shadows.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    SD_CHECK(p.scalar_type() == at::kFloat && p.is_contiguous(),
             "AdamW updates contiguous float32 tensors (parameter {} is {})", i, c10::toString(p.scalar_type()));
    int64_t covered = 0;
    for (const FlatPiece& piece : grads[i]) {
      const at::Tensor& g = piece.values;
      SD_CHECK(piece.offset == covered && g.dim() == 1 && g.is_contiguous() &&
                   (g.scalar_type() == at::kFloat || g.scalar_type() == at::kBFloat16),
               "AdamW reads flat contiguous float32 or bf16 gradients covering their parameter in order (parameter "
               "{}: a {} piece of {} elements at {}, after {})",
               i, c10::toString(g.scalar_type()), g.numel(), piece.offset, covered);
      covered += g.numel();
    }
    SD_CHECK(covered == p.numel(), "AdamW: parameter {} has {} elements, its gradient {}", i, p.numel(), covered);
    if (!rounded_copies.empty()) {
      const at::Tensor& r = rounded_copies[i];
      SD_CHECK(r.scalar_type() == at::kBFloat16 && r.is_contiguous() && r.numel() == p.numel(),
               "AdamW: the rounded copy of parameter {} must be a contiguous bf16 tensor of {} elements", i, p.numel());
    }
    if (!shadows.empty()) {
      const at::Tensor& s = shadows[i];
      SD_CHECK(s.scalar_type() == at::kFloat && s.is_contiguous() && s.numel() == p.numel(),
               "AdamW: the EMA shadow of parameter {} must be a contiguous float32 tensor of {} elements", i,
               p.numel());
    }
  }
}

}  // namespace

void AdamW::step(const std::vector<at::Tensor>& params, const std::vector<FlatPieces>& grads, double lr,
                 double grad_scale, const AdamWFollowers& followers) {
  check_step_arguments(params, grads, followers);
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
  // One pass over each tensor reading g, p, m, v and writing p, m, v (and the followers): the optimizer is
  // memory-bound, and LibTorch's op-by-op form reads and writes the same arrays about ten times (docs/benchmarks.md).
  for (size_t i = 0; i < params.size(); ++i) {
    for (const FlatPiece& piece : grads[i]) {
      const at::Tensor& g = piece.values;
      float* p = params[i].data_ptr<float>() + piece.offset;
      float* m = exp_avg_[i].data_ptr<float>() + piece.offset;
      float* v = exp_avg_sq_[i].data_ptr<float>() + piece.offset;
      const RangeFollowers f{
          followers.rounded_copies.empty()
              ? nullptr
              : reinterpret_cast<uint16_t*>(followers.rounded_copies[i].data_ptr<c10::BFloat16>()) + piece.offset,
          followers.ema_shadows.empty() ? nullptr : followers.ema_shadows[i].data_ptr<float>() + piece.offset,
          followers.ema_one_minus_decay};
      sd::parallel_for(0, g.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
        if (g.scalar_type() == at::kBFloat16)
          update_range(p, sd::bf16_bits(g), m, v, f, begin, end, c);
        else
          update_range(p, g.data_ptr<float>(), m, v, f, begin, end, c);
      });
    }
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
