// The row and slice kernels of small_head_attention.cpp, written once against one vector width's operations
// (core/simd.h: `Vec`, `kLanes`, load, store, exp, horizontal_sum, minus_infinity_past, ...) and included there once
// per width (AVX2's eight floats, AVX-512's sixteen), each time inside that width's target region. Not a header of
// its own.

// ---------------------------------------------------------------------------------------------------------------
// One row of one head with D channels. A head's keys and values are held transposed, [channel][key] in float32 with
// the keys padded to whole vectors (`n`), so that every loop runs over keys, kLanes at a time, with D multiply-adds
// per vector of keys and the D per-channel sums in registers.

// A vector of scores from key j on: round(scale · q·k), -inf for the padding past the last key.
template <int D>
SD_INLINE Vec scores(const RowContext& row, const Vec* q, int64_t j) {
  Vec acc = mul(q[0], load(row.kt + j));
  SD_UNROLL_CHANNELS
  for (int c = 1; c < D; ++c) acc = fmadd(q[c], load(row.kt + c * row.stride + j), acc);
  acc = mul(acc, splat(row.scale));
  if (row.rounding.scores) acc = round_to_bf16(acc);
  return j + kLanes <= row.keys ? acc : minus_infinity_past(acc, j, row.keys);
}

template <int D>
SD_INLINE void broadcast(const float* x, Vec* out) {
  SD_UNROLL_CHANNELS
  for (int c = 0; c < D; ++c) out[c] = splat(x[c]);
}

template <int D>
SD_INLINE void store_sums(const Vec* acc, float* out) {
  SD_UNROLL_CHANNELS
  for (int c = 0; c < D; ++c) out[c] = horizontal_sum(acc[c]);
}

SD_INLINE Vec probabilities(Vec scores, const RowStats& stats, const Rounding& rounding) {
  const Vec p = mul(exp(sub(scores, splat(stats.max))), splat(stats.inverse_sum));
  return rounding.probabilities ? round_to_bf16(p) : p;
}

// out = softmax(scores) v for query row q_row; `buffer` holds n floats. `kept` (n floats, or null) receives the
// row's probabilities for backward.
template <int D>
RowStats forward_row(const RowContext& row, const float* q_row, float* buffer, float* out, float* kept) {
  Vec q[D];
  broadcast<D>(q_row, q);
  Vec max_scores = splat(-INFINITY);
  for (int64_t j = 0; j < row.n; j += kLanes) {
    const Vec s = scores<D>(row, q, j);
    store(buffer + j, s);
    max_scores = max(max_scores, s);
  }
  RowStats stats{horizontal_max(max_scores), 1.f};
  const Vec row_max = splat(stats.max);
  Vec sum = zero();
  for (int64_t j = 0; j < row.n; j += kLanes) {
    const Vec e = exp(sub(load(buffer + j), row_max));
    store(buffer + j, e);
    sum = add(sum, e);
  }
  stats.inverse_sum = 1.f / horizontal_sum(sum);
  const Vec inverse_sum = splat(stats.inverse_sum);
  Vec acc[D];
  SD_UNROLL_CHANNELS
  for (int c = 0; c < D; ++c) acc[c] = zero();
  for (int64_t j = 0; j < row.n; j += kLanes) {
    Vec p = mul(load(buffer + j), inverse_sum);
    if (row.rounding.probabilities) p = round_to_bf16(p);
    if (kept) store(kept + j, p);
    SD_UNROLL_CHANNELS
    for (int c = 0; c < D; ++c) acc[c] = fmadd(p, load(row.vt + c * row.stride + j), acc[c]);
  }
  store_sums<D>(acc, out);
  return stats;
}

// One query row's share of the backward pass: writes dq_row, adds to dkt and dvt ([channel][key] like kt and vt).
// `kept` holds the row's probabilities as forward kept them, or is null: then they are recomputed into `buffer`.
// `buffer` and `d_scores` hold n floats each.
template <int D>
void backward_row(const RowContext& row, const RowStats& stats, const float* q_row, const float* d_out_row,
                  const float* kept, float* buffer, float* d_scores, float* dq_row, float* dkt, float* dvt) {
  Vec q[D], d_out[D];
  broadcast<D>(q_row, q);
  broadcast<D>(d_out_row, d_out);
  // P, dP = d_out vᵀ, and Σ P ∘ dP.
  Vec dot = zero();
  for (int64_t j = 0; j < row.n; j += kLanes) {
    const Vec p = kept ? load(kept + j) : probabilities(scores<D>(row, q, j), stats, row.rounding);
    Vec dp = mul(d_out[0], load(row.vt + j));
    SD_UNROLL_CHANNELS
    for (int c = 1; c < D; ++c) dp = fmadd(d_out[c], load(row.vt + c * row.stride + j), dp);
    if (!kept) store(buffer + j, p);
    store(d_scores + j, dp);
    dot = fmadd(p, dp, dot);
  }
  // dS = P ∘ (dP - Σ P ∘ dP) · scale, then dq += dS k, dk += dSᵀ q, dv += Pᵀ d_out.
  const float* probs = kept ? kept : buffer;
  const Vec row_dot = splat(horizontal_sum(dot)), scale = splat(row.scale);
  Vec dq[D];
  SD_UNROLL_CHANNELS
  for (int c = 0; c < D; ++c) dq[c] = zero();
  for (int64_t j = 0; j < row.n; j += kLanes) {
    const Vec p = load(probs + j);
    const Vec ds = mul(mul(p, sub(load(d_scores + j), row_dot)), scale);
    SD_UNROLL_CHANNELS
    for (int c = 0; c < D; ++c) {
      dq[c] = fmadd(ds, load(row.kt + c * row.stride + j), dq[c]);
      float* dk = dkt + c * row.stride + j;
      store(dk, fmadd(ds, q[c], load(dk)));
      float* dv = dvt + c * row.stride + j;
      store(dv, fmadd(p, d_out[c], load(dv)));
    }
  }
  store_sums<D>(dq, dq_row);
}

// Backward over the probabilities forward kept, in two sweeps. backward_row adds each row's share to every dk and dv
// vector, a load and a store per channel and vector of keys for every row, and its loop waits on those stores. Here
// a first sweep, row by row, writes each row's score gradients dS and its dq; a second, vector of keys by vector of
// keys, sums dk and dv over the rows in registers. The sums are backward_row's, in the same order: the same bits.

// Row `row`'s dS = P ∘ (dP − rowsum(P ∘ dP)) · scale into `d_scores` (n floats) from its kept probabilities `probs`,
// and its dq = dS k.
template <int D>
void score_gradients_row(const RowContext& row, const float* probs, const float* d_out_row, float* d_scores,
                         float* dq_row) {
  Vec d_out[D];
  broadcast<D>(d_out_row, d_out);
  Vec dot = zero();
  for (int64_t j = 0; j < row.n; j += kLanes) {
    Vec dp = mul(d_out[0], load(row.vt + j));
    SD_UNROLL_CHANNELS
    for (int c = 1; c < D; ++c) dp = fmadd(d_out[c], load(row.vt + c * row.stride + j), dp);
    store(d_scores + j, dp);
    dot = fmadd(load(probs + j), dp, dot);
  }
  const Vec row_dot = splat(horizontal_sum(dot)), scale = splat(row.scale);
  Vec dq[D];
  SD_UNROLL_CHANNELS
  for (int c = 0; c < D; ++c) dq[c] = zero();
  for (int64_t j = 0; j < row.n; j += kLanes) {
    const Vec ds = mul(mul(load(probs + j), sub(load(d_scores + j), row_dot)), scale);
    store(d_scores + j, ds);
    SD_UNROLL_CHANNELS
    for (int c = 0; c < D; ++c) dq[c] = fmadd(ds, load(row.kt + c * row.stride + j), dq[c]);
  }
  store_sums<D>(dq, dq_row);
}

// out[c][j] = Σ_i weights[i][j] · x[i][c] ([D][stride] out, [rows][n] weights, [rows][D] x) for every key j < n,
// over the rows in order; under a causal mask only over the rows that see key j (query i sees the vectors of keys
// below padded(i + 1)).
template <int D>
void sum_over_rows(const float* weights, const float* x, int64_t rows, int64_t n, int64_t stride, bool causal,
                   float* out) {
  for (int64_t j = 0; j < n; j += kLanes) {
    Vec acc[D];
    SD_UNROLL_CHANNELS
    for (int c = 0; c < D; ++c) acc[c] = zero();
    for (int64_t i = causal ? j / kKeyPadding * kKeyPadding : 0; i < rows; ++i) {
      const Vec w = load(weights + i * n + j);
      SD_UNROLL_CHANNELS
      for (int c = 0; c < D; ++c) acc[c] = fmadd(w, splat(x[i * D + c]), acc[c]);
    }
    SD_UNROLL_CHANNELS
    for (int c = 0; c < D; ++c) store(out + c * stride + j, acc[c]);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// One batch x head slice.

// The forward pass of slice (b, h): writes its rows of `out` and their stats, and to `kept` (null, or the slice's
// [queries][n] floats) its probabilities.
template <int D, typename T>
void forward_slice(const Problem& p, const Tensors<T>& in, int64_t b, int64_t h, T* out, RowStats* stats, float* kept) {
  const KeysAndValues kv = KeysAndValues::of<D>(p, in, b, h);
  const RowContext row = kv.row_context(p);
  std::vector<float> buffer(p.n);
  const SliceOf<const T> q(in.q, p, b, h, p.queries);
  const SliceOf<T> o(out, p, b, h, p.queries);
  for (int64_t i = 0; i < p.queries; ++i) {
    float q_row[D], out_row[D];
    convert_row<D>(q.row(i), q_row);
    stats[i] = forward_row<D>(context_of_row(row, p, i), q_row, buffer.data(), out_row, kept ? kept + i * p.n : nullptr);
    convert_row<D>(out_row, o.row(i));
  }
}

// The backward pass of slice (b, h): with S = q kᵀ · scale, P = softmax(S), out = P v and dP = d_out vᵀ,
//   dv = Pᵀ d_out,  dS = P ∘ (dP − rowsum(P ∘ dP)),  dq = dS k · scale,  dk = dSᵀ q · scale.
// `kept`: the slice's probabilities as forward kept them, or null to recompute them from q, k and the stats.
template <int D, typename T>
void backward_slice(const Problem& p, const Tensors<T>& in, const T* d_out, const RowStats* stats, const float* kept,
                    int64_t b, int64_t h, const Gradients<T>& grads) {
  const KeysAndValues kv = KeysAndValues::of<D>(p, in, b, h);
  const RowContext row = kv.row_context(p);
  std::vector<float> dkt(D * p.stride, 0.f), dvt(D * p.stride, 0.f), buffer(p.n), d_scores(p.n);
  const SliceOf<const T> q(in.q, p, b, h, p.queries), g(d_out, p, b, h, p.queries);
  const SliceOf<T> dq(grads.dq, p, b, h, p.queries);
  for (int64_t i = 0; i < p.queries; ++i) {
    float q_row[D], d_out_row[D], dq_row[D];
    convert_row<D>(q.row(i), q_row);
    convert_row<D>(g.row(i), d_out_row);
    backward_row<D>(context_of_row(row, p, i), stats[i], q_row, d_out_row, kept ? kept + i * p.n : nullptr,
                    buffer.data(), d_scores.data(), dq_row, dkt.data(), dvt.data());
    convert_row<D>(dq_row, dq.row(i));
  }
  store_transposed<D>(dkt.data(), p.keys, p.stride, SliceOf<T>(grads.dk, p, b, h, p.keys));
  store_transposed<D>(dvt.data(), p.keys, p.stride, SliceOf<T>(grads.dv, p, b, h, p.keys));
}

// backward_slice for a slice whose probabilities forward kept (`kept`, [queries][n]), in the two sweeps above.
template <int D, typename T>
void backward_kept_slice(const Problem& p, const Tensors<T>& in, const T* d_out, const float* kept, int64_t b,
                         int64_t h, const Gradients<T>& grads) {
  const KeysAndValues kv = KeysAndValues::of<D>(p, in, b, h);
  const RowContext row = kv.row_context(p);
  std::vector<float> q_rows(p.queries * D), d_out_rows(p.queries * D), dkt(D * p.stride), dvt(D * p.stride);
  const std::unique_ptr<float[]> d_scores(new float[p.queries * p.n]);  // [queries][n], each row's first row.n set
  const SliceOf<const T> q(in.q, p, b, h, p.queries), g(d_out, p, b, h, p.queries);
  const SliceOf<T> dq(grads.dq, p, b, h, p.queries);
  for (int64_t i = 0; i < p.queries; ++i) {
    float dq_row[D];
    convert_row<D>(q.row(i), &q_rows[i * D]);
    convert_row<D>(g.row(i), &d_out_rows[i * D]);
    score_gradients_row<D>(context_of_row(row, p, i), kept + i * p.n, &d_out_rows[i * D], &d_scores[i * p.n], dq_row);
    convert_row<D>(dq_row, dq.row(i));
  }
  sum_over_rows<D>(d_scores.get(), q_rows.data(), p.queries, p.n, p.stride, p.causal, dkt.data());  // dk = dSᵀ q
  sum_over_rows<D>(kept, d_out_rows.data(), p.queries, p.n, p.stride, p.causal, dvt.data());         // dv = Pᵀ d_out
  store_transposed<D>(dkt.data(), p.keys, p.stride, SliceOf<T>(grads.dk, p, b, h, p.keys));
  store_transposed<D>(dvt.data(), p.keys, p.stride, SliceOf<T>(grads.dv, p, b, h, p.keys));
}
