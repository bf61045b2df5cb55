// AdamW's pass over one range of a tensor (train/adamw.cpp), written once against core/simd.h's operations and
// included there once per vector width. Not a header of its own. Gradients come in float32 or bf16 (their bits as
// uint16_t); a range's last values short of a vector go through masked loads and stores, so every value takes the
// same vector arithmetic whatever its position.

#include "core/simd_up_to.inl"

// The EMA's shadow -= (shadow - p) * (1 - decay), rounded after the product as torch computes it.
inline Vec moved_towards(Vec shadow, Vec p, Vec one_minus_decay) {
  return sub(shadow, kept_rounded(mul(sub(shadow, p), one_minus_decay)));
}

// torch.optim.AdamW's single-tensor update in its order of float32 operations (AdamWCoefficients), with LibTorch's
// vector kernels' fused multiply-adds; then the followers. The rounded copy is only written (the next forward reads
// it from memory anyway): streaming stores spare the cache-line fills that ordinary stores make first, 2 of the pass's
// 30 bytes per parameter, where the range's copy is aligned for them (it stays so at kLanes values a turn).
template <typename Grad>
void adamw_range(float* p, const Grad* g, float* m, float* v, const RangeFollowers& f, int64_t begin, int64_t end,
                 const AdamWCoefficients& c) {
  const Vec grad_scale = splat(c.grad_scale), decay = splat(c.decay), beta1 = splat(c.beta1),
            one_minus_beta1 = splat(c.one_minus_beta1), beta2 = splat(c.beta2),
            one_minus_beta2 = splat(c.one_minus_beta2), sqrt_bias_correction2 = splat(c.sqrt_bias_correction2),
            eps = splat(c.eps), neg_step_size = splat(c.neg_step_size), ema_rate = splat(f.one_minus_decay);
  const bool stream = f.rounded && reinterpret_cast<uintptr_t>(f.rounded + begin) % (kLanes * sizeof(uint16_t)) == 0;
  for (int64_t i = begin; i < end; i += kLanes) {
    const int64_t n = end - i;
    const Vec grad = mul(load_up_to(g + i, n), grad_scale);
    const Vec param = mul(load_up_to(p + i, n), decay);
    const Vec m_new = fmadd(grad, one_minus_beta1, mul(load_up_to(m + i, n), beta1));
    const Vec v_new = fmadd(mul(grad, one_minus_beta2), grad, mul(load_up_to(v + i, n), beta2));
    const Vec denom = add(div(sqrt(v_new), sqrt_bias_correction2), eps);
    const Vec p_new = fmadd(neg_step_size, div(m_new, denom), param);
    store_up_to(m + i, m_new, n);
    store_up_to(v + i, v_new, n);
    store_up_to(p + i, p_new, n);
    if (f.rounded) {
      if (stream && n >= kLanes)
        store_streaming(f.rounded + i, canonical_nans(p_new));
      else
        store_up_to(f.rounded + i, canonical_nans(p_new), n);
    }
    if (f.shadow) store_up_to(f.shadow + i, moved_towards(load_up_to(f.shadow + i, n), p_new, ema_rate), n);
  }
  if (stream) _mm_sfence();  // streaming stores are weakly ordered: done before the range's thread joins
}
