// The softmax rows of wide_head_attention.cpp, forward and backward, written once against core/simd.h's operations
// and included there once per vector width. Not a header of its own. A row's last n % kLanes values go through
// masked loads and stores, so the rows need no padding.
//
// Scores and the probabilities' gradients are float32. The probabilities P and the scores' gradients, which the
// products read next, are float32 (written in place over the float32 rows) or bf16 (their bits as uint16_t, rounded
// once as they are stored).

// One score widened, rounded to bf16 first if `round_scores` (as a bf16 baddbmm writes the scores).
inline Vec score_at(const float* x, bool round_scores) { return round_scores ? round_to_bf16(load(x)) : load(x); }
inline Vec scores_first(const float* x, int64_t count, bool round_scores) {
  const Vec s = load_first(x, count, -INFINITY);
  return round_scores ? round_to_bf16(s) : s;  // -inf stays -inf
}

// softmax over each of `rows` rows of n scores into `probs`: the row's maximum, the exponentials of the differences
// (kept in the score row) and their sum, then each exponential times the sum's reciprocal, as LibTorch's softmax
// computes it. A NaN in a row makes the whole row NaN, as there. `stats` (rows entries, or null) receives each row's
// maximum and reciprocal.
template <typename P>
inline void softmax_rows(float* x, P* probs, int64_t rows, int64_t n, bool round_scores, RowStats* stats) {
  const int64_t full = n / kLanes * kLanes, rest = n - full;
  for (int64_t r = 0; r < rows; ++r, x += n, probs += n) {
    Vec largest = splat(-INFINITY);
    for (int64_t j = 0; j < full; j += kLanes) largest = max(largest, score_at(x + j, round_scores));
    if (rest) largest = max(largest, scores_first(x + full, rest, round_scores));
    const float row_max = horizontal_max(largest);
    Vec sum = zero();
    for (int64_t j = 0; j < full; j += kLanes) {
      const Vec e = exp(sub(score_at(x + j, round_scores), splat(row_max)));
      store(x + j, e);
      sum = add(sum, e);
    }
    if (rest) {
      const Vec e = exp(sub(scores_first(x + full, rest, round_scores), splat(row_max)));  // exp(-inf) = 0 past the row
      store_first(x + full, e, rest);
      sum = add(sum, e);
    }
    const float inverse_sum = 1.f / horizontal_sum(sum);
    for (int64_t j = 0; j < full; j += kLanes) store(probs + j, mul(load(x + j), splat(inverse_sum)));
    if (rest) store_first(probs + full, mul(load_first(x + full, rest, 0.f), splat(inverse_sum)), rest);
    if (stats) stats[r] = {row_max, inverse_sum};
  }
}

// The probabilities softmax_rows gave, again from the same scores and its row statistics: exp(x - max) times the
// reciprocal, the same operations on the same numbers, so the same bits.
template <typename P>
inline void probabilities_rows(const float* x, P* probs, const RowStats* stats, int64_t rows, int64_t n,
                               bool round_scores) {
  const int64_t full = n / kLanes * kLanes, rest = n - full;
  for (int64_t r = 0; r < rows; ++r, x += n, probs += n) {
    const Vec row_max = splat(stats[r].max), inverse_sum = splat(stats[r].inverse_sum);
    for (int64_t j = 0; j < full; j += kLanes)
      store(probs + j, mul(exp(sub(score_at(x + j, round_scores), row_max)), inverse_sum));
    if (rest)
      store_first(probs + full, mul(exp(sub(scores_first(x + full, rest, round_scores), row_max)), inverse_sum), rest);
  }
}

// softmax's backward over each of `rows` rows of n values, from its output p and the output's gradient dp, into the
// scores' gradient ds = p ∘ (dp − Σ p ∘ dp) (in place over dp for float32).
template <typename P>
inline void softmax_backward_rows(const float* dp, const P* p, P* ds, int64_t rows, int64_t n) {
  const int64_t full = n / kLanes * kLanes, rest = n - full;
  for (int64_t r = 0; r < rows; ++r, dp += n, p += n, ds += n) {
    Vec products = zero();
    for (int64_t j = 0; j < full; j += kLanes) products = fmadd(load(p + j), load(dp + j), products);
    if (rest) products = fmadd(load_first(p + full, rest, 0.f), load_first(dp + full, rest, 0.f), products);
    const Vec dot = splat(horizontal_sum(products));
    for (int64_t j = 0; j < full; j += kLanes) store(ds + j, mul(load(p + j), sub(load(dp + j), dot)));
    if (rest)
      store_first(ds + full, mul(load_first(p + full, rest, 0.f), sub(load_first(dp + full, rest, 0.f), dot)), rest);
  }
}
