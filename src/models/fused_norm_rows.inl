// The rows of fused_norm.cpp, forward and backward, written once against core/simd.h's operations and included there
// once per vector width. Not a header of its own. Values are T: float32, or bf16 as their bits (uint16_t); arithmetic
// float32. A row's last n % kLanes values go through masked loads and stores, so rows need no padding.
//
// A row's affine parameters (float32 here) come per segment: `segment` consecutive values share one (a group norm's
// pixels of one channel), or with segment 1 every value has its own (a layer norm's features).

#include "core/simd_up_to.inl"

// A row's mean and 1/sqrt(variance + eps), the variance biased (over n) and summed as squared deviations from the
// mean (two passes: no cancellation however far the mean lies from zero).
template <typename T>
inline RowMoments row_moments(const T* x, int64_t n, float eps) {
  Vec sum = zero();
  for (int64_t j = 0; j < n; j += kLanes) sum = add(sum, load_up_to(x + j, n - j));
  const float mean = horizontal_sum(sum) / static_cast<float>(n);
  Vec squares = zero();
  for (int64_t j = 0; j < n; j += kLanes) {
    const Vec deviation = sub(load_up_to(x + j, n - j, mean), splat(mean));  // 0 past the row
    squares = fmadd(deviation, deviation, squares);
  }
  const float variance = horizontal_sum(squares) / static_cast<float>(n);
  return {mean, 1.f / std::sqrt(variance + eps)};
}

// y = (x − mean) · rstd · gamma + beta over one row, stored as T (bf16: rounded once; per segment with a = rstd ·
// gamma, as (x − mean) · a + beta). x − mean is exact for bf16 values near the mean, so a constant row gives beta exactly.
template <typename T>
inline void normalize_row(const T* x, T* y, int64_t n, int64_t segment, const float* gamma,
                          const float* beta, RowMoments m) {
  if (segment == 1) {
    const Vec mean = splat(m.mean), rstd = splat(m.rstd);
    for (int64_t j = 0; j < n; j += kLanes) {
      const Vec normalized = mul(sub(load_up_to(x + j, n - j), mean), rstd);
      store_up_to(y + j, fmadd(normalized, load_up_to(gamma + j, n - j), load_up_to(beta + j, n - j)), n - j);
    }
    return;
  }
  for (int64_t s = 0; s < n / segment; ++s, x += segment, y += segment) {
    const Vec mean = splat(m.mean), scale = splat(m.rstd * gamma[s]), shift = splat(beta[s]);
    for (int64_t j = 0; j < segment; j += kLanes)
      store_up_to(y + j, fmadd(sub(load_up_to(x + j, segment - j), mean), scale, shift), segment - j);
  }
}

// Backward over one row. With g = dy · gamma and x̂ = (x − mean) · rstd, the input's gradient is
//   dx = rstd · (g − Σg / n − x̂ · Σ(g · x̂) / n) = rstd · g − k · (x − mean) − rstd · Σg / n,
// k = rstd³ · Σ(g · (x − mean)) / n. The sums come from a first pass; per segment it keeps Σdy and Σdy·(x − mean)
// in `segment_sums` [n / segment][2], which the parameters' gradients sum over rows next.
template <typename T>
inline void input_gradient_row(const T* dy, const T* x, T* dx, int64_t n, int64_t segment,
                               const float* gamma, RowMoments m, float* segment_sums) {
  const Vec mean = splat(m.mean);
  float sum_g = 0, sum_g_centered = 0;
  if (segment == 1) {
    Vec g_sum = zero(), centered_sum = zero();
    for (int64_t j = 0; j < n; j += kLanes) {
      const Vec g = mul(load_up_to(dy + j, n - j), load_up_to(gamma + j, n - j));
      g_sum = add(g_sum, g);
      centered_sum = fmadd(g, sub(load_up_to(x + j, n - j), mean), centered_sum);
    }
    sum_g = horizontal_sum(g_sum);
    sum_g_centered = horizontal_sum(centered_sum);
  } else {
    for (int64_t s = 0; s < n / segment; ++s) {
      const T *dy_s = dy + s * segment, *x_s = x + s * segment;
      Vec dy_sum = zero(), centered_sum = zero();
      for (int64_t j = 0; j < segment; j += kLanes) {
        const Vec d = load_up_to(dy_s + j, segment - j);
        dy_sum = add(dy_sum, d);
        centered_sum = fmadd(d, sub(load_up_to(x_s + j, segment - j), mean), centered_sum);
      }
      segment_sums[2 * s] = horizontal_sum(dy_sum);
      segment_sums[2 * s + 1] = horizontal_sum(centered_sum);
      sum_g += gamma[s] * segment_sums[2 * s];
      sum_g_centered += gamma[s] * segment_sums[2 * s + 1];
    }
  }
  const float inverse_n = 1.f / static_cast<float>(n);
  const Vec minus_k = splat(-m.rstd * m.rstd * m.rstd * sum_g_centered * inverse_n);
  const Vec c = splat(-m.rstd * sum_g * inverse_n);
  if (segment == 1) {
    const Vec rstd = splat(m.rstd);
    for (int64_t j = 0; j < n; j += kLanes) {
      const Vec g = mul(load_up_to(dy + j, n - j), load_up_to(gamma + j, n - j));
      store_up_to(dx + j, fmadd(rstd, g, fmadd(minus_k, sub(load_up_to(x + j, n - j), mean), c)), n - j);
    }
    return;
  }
  for (int64_t s = 0; s < n / segment; ++s, dy += segment, x += segment, dx += segment) {
    const Vec scale = splat(m.rstd * gamma[s]);
    for (int64_t j = 0; j < segment; j += kLanes) {
      const Vec rest = fmadd(minus_k, sub(load_up_to(x + j, segment - j), mean), c);
      store_up_to(dx + j, fmadd(scale, load_up_to(dy + j, segment - j), rest), segment - j);
    }
  }
}

// The per-value parameters' gradients for columns [begin, end) of rows 0, step, 2·step, ... below `rows`, each of n
// values: dgamma = Σ dy · (x − mean) · rstd and dbeta = Σ dy, summed over those rows in order.
template <typename T>
inline void parameter_gradient_columns(const T* dy, const T* x, const RowMoments* m, int64_t rows,
                                       int64_t n, int64_t step, int64_t begin, int64_t end, float* dgamma,
                                       float* dbeta) {
  for (int64_t j = begin; j < end; j += kLanes) {
    Vec gamma_sum = zero(), beta_sum = zero();
    for (int64_t r = 0; r < rows; r += step) {
      const Vec d = load_up_to(dy + r * n + j, end - j);
      const Vec normalized = mul(sub(load_up_to(x + r * n + j, end - j), splat(m[r].mean)), splat(m[r].rstd));
      gamma_sum = fmadd(d, normalized, gamma_sum);
      beta_sum = add(beta_sum, d);
    }
    if (end - j >= kLanes) {
      store(dgamma + j, gamma_sum);
      store(dbeta + j, beta_sum);
    } else {
      store_first(dgamma + j, gamma_sum, end - j);
      store_first(dbeta + j, beta_sum, end - j);
    }
  }
}
