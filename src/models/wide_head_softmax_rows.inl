// The softmax rows of wide_head_attention.cpp, forward and backward, written once against core/simd.h's operations
// and included there once per vector width. Not a header of its own. A row's last n % kLanes floats go through
// masked loads and stores, so the rows need no padding.

// softmax over each of `rows` rows of n floats, in place: the row's maximum, the exponentials of the differences and
// their sum, then each exponential times the sum's reciprocal, as LibTorch's softmax computes it. A NaN in a row
// makes the whole row NaN, as there. `stats` (rows entries, or null) receives each row's maximum and reciprocal.
inline void softmax_rows(float* x, int64_t rows, int64_t n, RowStats* stats) {
  const int64_t full = n / kLanes * kLanes, rest = n - full;
  for (int64_t r = 0; r < rows; ++r, x += n) {
    Vec largest = splat(-INFINITY);
    for (int64_t j = 0; j < full; j += kLanes) largest = max(largest, load(x + j));
    if (rest) largest = max(largest, load_first(x + full, rest, -INFINITY));
    const float row_max = horizontal_max(largest);
    Vec sum = zero();
    for (int64_t j = 0; j < full; j += kLanes) {
      const Vec e = exp(sub(load(x + j), splat(row_max)));
      store(x + j, e);
      sum = add(sum, e);
    }
    if (rest) {
      const Vec e = exp(sub(load_first(x + full, rest, -INFINITY), splat(row_max)));  // exp(-inf) = 0 past the row
      store_first(x + full, e, rest);
      sum = add(sum, e);
    }
    const float inverse_sum = 1.f / horizontal_sum(sum);
    for (int64_t j = 0; j < full; j += kLanes) store(x + j, mul(load(x + j), splat(inverse_sum)));
    if (rest) store_first(x + full, mul(load_first(x + full, rest, 0.f), splat(inverse_sum)), rest);
    if (stats) stats[r] = {row_max, inverse_sum};
  }
}

// The probabilities softmax_rows gave, again from the same scores and its row statistics: exp(x - max) times the
// reciprocal, the same operations on the same numbers, so the same bits.
inline void probabilities_rows(float* x, const RowStats* stats, int64_t rows, int64_t n) {
  const int64_t full = n / kLanes * kLanes, rest = n - full;
  for (int64_t r = 0; r < rows; ++r, x += n) {
    const Vec row_max = splat(stats[r].max), inverse_sum = splat(stats[r].inverse_sum);
    for (int64_t j = 0; j < full; j += kLanes) store(x + j, mul(exp(sub(load(x + j), row_max)), inverse_sum));
    if (rest)
      store_first(x + full, mul(exp(sub(load_first(x + full, rest, -INFINITY), row_max)), inverse_sum), rest);
  }
}

// softmax's backward over each of `rows` rows of n floats, from its output p and written over the output's gradient
// dp: dp = p ∘ (dp − Σ p ∘ dp).
inline void softmax_backward_rows(float* dp, const float* p, int64_t rows, int64_t n) {
  const int64_t full = n / kLanes * kLanes, rest = n - full;
  for (int64_t r = 0; r < rows; ++r, dp += n, p += n) {
    Vec products = zero();
    for (int64_t j = 0; j < full; j += kLanes) products = fmadd(load(p + j), load(dp + j), products);
    if (rest) products = fmadd(load_first(p + full, rest, 0.f), load_first(dp + full, rest, 0.f), products);
    const Vec dot = splat(horizontal_sum(products));
    for (int64_t j = 0; j < full; j += kLanes) store(dp + j, mul(load(p + j), sub(load(dp + j), dot)));
    if (rest)
      store_first(dp + full, mul(load_first(p + full, rest, 0.f), sub(load_first(dp + full, rest, 0.f), dot)), rest);
  }
}
