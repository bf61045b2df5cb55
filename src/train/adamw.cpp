#include "train/adamw.h"

#include <ATen/core/grad_mode.h>
#include <immintrin.h>

#include <cmath>

#include "core/bf16_avx2.h"
#include "core/error.h"
#include "core/parallel.h"

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

// Gradients arrive in float32 or, straight from a bf16 backward with nothing to sum, in bf16 (widened exactly).
template <typename Grad>
float update_one(float& p, Grad g_raw, float& m, float& v, const AdamWCoefficients& c) {
  const float g = static_cast<float>(g_raw) * c.grad_scale;
  const float param = p * c.decay;
  m = m * c.beta1 + c.one_minus_beta1 * g;
  v = v * c.beta2 + c.one_minus_beta2 * g * g;
  return p = param + c.neg_step_size * (m / (std::sqrt(v) / c.sqrt_bias_correction2 + c.eps));
}

__attribute__((target("avx2,fma"))) __m256 load8(const float* g) { return _mm256_loadu_ps(g); }
__attribute__((target("avx2,fma"))) __m256 load8(const c10::BFloat16* g) { return load8_bf16(g); }

// Rounds to bf16 as c10::BFloat16(float) does: to nearest, ties to even; NaN becomes 0x7FC0. `stream`: a
// non-temporal store, which needs `out` 16-byte aligned.
__attribute__((target("avx2,fma"))) void store8_rounded(c10::BFloat16* out, __m256 x, bool stream) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  const __m256i halves = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), nan);
  // Pack the eight 32-bit lanes' low halves into eight consecutive 16-bit values.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(halves, halves), 0xD8);
  if (stream)
    _mm_stream_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
  else
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
}

// One range's pointers into what the pass writes besides p, m and v; null where the step does not write it.
struct RangeFollowers {
  c10::BFloat16* rounded;
  float* shadow;
  float one_minus_decay;
};

// The EMA's shadow -= (shadow - p) * (1 - decay) with a rounding after the product, as torch computes it: the empty
// asm keeps GCC (whose GNU mode contracts a*b - c where FMA is enabled) from fusing the product into the subtraction.
__attribute__((target("avx2,fma"))) inline __m256 moved_towards(__m256 shadow, __m256 p, __m256 one_minus_decay) {
  __m256 step = _mm256_mul_ps(_mm256_sub_ps(shadow, p), one_minus_decay);
  asm("" : "+x"(step));
  return _mm256_sub_ps(shadow, step);
}
inline float moved_towards(float shadow, float p, float one_minus_decay) {
  float step = (shadow - p) * one_minus_decay;
  asm("" : "+x"(step));
  return shadow - step;
}

template <typename Grad>
void update_one_and_followers(float& p, Grad g, float& m, float& v, const AdamWCoefficients& c, const RangeFollowers& f,
                              int64_t i) {
  const float p_new = update_one(p, g, m, v, c);
  if (f.rounded) f.rounded[i] = c10::BFloat16(p_new);
  if (f.shadow) f.shadow[i] = moved_towards(f.shadow[i], p_new, f.one_minus_decay);
}

// Eight elements at a time with AVX2 (and its fused multiply-adds, as LibTorch's vector kernels use them); the
// scalar form for the tail and for CPUs without AVX2.
template <typename Grad>
__attribute__((target("avx2,fma"))) void update_range_avx2(float* p, const Grad* g, float* m, float* v,
                                                           const RangeFollowers& f, int64_t begin, int64_t end,
                                                           const AdamWCoefficients& c) {
  const __m256 grad_scale = _mm256_set1_ps(c.grad_scale), decay = _mm256_set1_ps(c.decay),
               beta1 = _mm256_set1_ps(c.beta1), one_minus_beta1 = _mm256_set1_ps(c.one_minus_beta1),
               beta2 = _mm256_set1_ps(c.beta2), one_minus_beta2 = _mm256_set1_ps(c.one_minus_beta2),
               sqrt_bias_correction2 = _mm256_set1_ps(c.sqrt_bias_correction2), eps = _mm256_set1_ps(c.eps),
               neg_step_size = _mm256_set1_ps(c.neg_step_size), ema_rate = _mm256_set1_ps(f.one_minus_decay);
  int64_t i = begin;
  // The rounded copy is only written (the next forward reads it from memory anyway): streaming stores spare the
  // cache-line fills that ordinary stores make first, 2 of the pass's 30 bytes per parameter. They need 16-byte
  // alignment, which a range keeps or lacks throughout at eight values a turn.
  const bool stream = f.rounded && reinterpret_cast<uintptr_t>(f.rounded + i) % 16 == 0;
  for (; i + 8 <= end; i += 8) {
    const __m256 grad = _mm256_mul_ps(load8(g + i), grad_scale);
    const __m256 param = _mm256_mul_ps(_mm256_loadu_ps(p + i), decay);
    const __m256 m_new = _mm256_fmadd_ps(grad, one_minus_beta1, _mm256_mul_ps(_mm256_loadu_ps(m + i), beta1));
    const __m256 v_new =
        _mm256_fmadd_ps(_mm256_mul_ps(grad, one_minus_beta2), grad, _mm256_mul_ps(_mm256_loadu_ps(v + i), beta2));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v_new), sqrt_bias_correction2), eps);
    const __m256 p_new = _mm256_fmadd_ps(neg_step_size, _mm256_div_ps(m_new, denom), param);
    _mm256_storeu_ps(m + i, m_new);
    _mm256_storeu_ps(v + i, v_new);
    _mm256_storeu_ps(p + i, p_new);
    if (f.rounded) store8_rounded(f.rounded + i, p_new, stream);
    if (f.shadow) _mm256_storeu_ps(f.shadow + i, moved_towards(_mm256_loadu_ps(f.shadow + i), p_new, ema_rate));
  }
  if (stream) _mm_sfence();  // streaming stores are weakly ordered: done before the range's thread joins
  for (; i < end; ++i) update_one_and_followers(p[i], g[i], m[i], v[i], c, f, i);
}

template <typename Grad>
void update_range(float* p, const Grad* g, float* m, float* v, const RangeFollowers& f, int64_t begin, int64_t end,
                  const AdamWCoefficients& c) {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2) return update_range_avx2(p, g, m, v, f, begin, end, c);
  for (int64_t i = begin; i < end; ++i) update_one_and_followers(p[i], g[i], m[i], v[i], c, f, i);
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
          followers.rounded_copies.empty() ? nullptr
                                           : followers.rounded_copies[i].data_ptr<c10::BFloat16>() + piece.offset,
          followers.ema_shadows.empty() ? nullptr : followers.ema_shadows[i].data_ptr<float>() + piece.offset,
          followers.ema_one_minus_decay};
      sd::parallel_for(0, g.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
        if (g.scalar_type() == at::kBFloat16)
          update_range(p, g.data_ptr<c10::BFloat16>(), m, v, f, begin, end, c);
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
