#include "models/small_head_attention.h"

#include <immintrin.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "perf/op_profiler.h"

namespace sd::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kMaxHeadChannels = 16;
constexpr int64_t kLanes = 8;  // float32 values per AVX2 register

#define SD_AVX2 __attribute__((target("avx2,fma")))
#define SD_INLINE __attribute__((always_inline)) inline
// GCC at -O2 keeps loops over the D channels rolled, and with them the per-channel sums in memory (measured: a
// store-to-load round trip per multiply-add, 2x slower rows).
#define SD_UNROLL_CHANNELS _Pragma("GCC unroll 16")

// ---------------------------------------------------------------------------------------------------------------
// Eight floats at a time.

// exp(x): Cephes' expf (x = n·ln2 + r with |r| ≤ ln2/2, 2^n from the exponent bits, e^r from a degree-7 polynomial),
// within 2 ulp of std::exp. Below -87.3, where float32's exp leaves the normal range, and for -inf it gives 0; NaN
// stays NaN (min and max return their second operand when one is NaN).
SD_AVX2 SD_INLINE __m256 exp8(__m256 x) {
  const __m256 underflows = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_set1_ps(88.3f), _mm256_max_ps(_mm256_set1_ps(-87.3f), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - n·ln2, with ln2 split in two so that n·ln2_high is exact.
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflows, _mm256_mul_ps(p, _mm256_castsi256_ps(exponent)));
}

// x rounded to the nearest bf16 (ties to even) and widened back, as storing to bf16 and loading again would.
SD_AVX2 SD_INLINE __m256 round_to_bf16(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  return _mm256_castsi256_ps(_mm256_and_si256(rounded, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

SD_AVX2 SD_INLINE float horizontal_sum(__m256 x) {
  const __m128 pairs = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  const __m128 twos = _mm_add_ps(pairs, _mm_movehl_ps(pairs, pairs));
  return _mm_cvtss_f32(_mm_add_ss(twos, _mm_movehdup_ps(twos)));
}

SD_AVX2 SD_INLINE float horizontal_max(__m256 x) {
  const __m128 pairs = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  const __m128 twos = _mm_max_ps(pairs, _mm_movehl_ps(pairs, pairs));
  return _mm_cvtss_f32(_mm_max_ss(twos, _mm_movehdup_ps(twos)));
}

// ---------------------------------------------------------------------------------------------------------------
// One row of one head with D channels. A head's keys and values are held transposed, [channel][key] in float32 with
// the keys padded to whole vectors (`n`), so that every loop runs over keys, eight at a time, with D multiply-adds per
// eight keys and the D per-channel sums in registers.

struct Rounding {
  bool scores;         // to bf16, as the reference's bf16 baddbmm writes them
  bool probabilities;  // to bf16, as softmax(...).to(v.dtype) does
};

// The row's context: its keys, their count, padded count and the distance between channels in kt and vt (and in
// the gradients dkt and dvt), and the scores' scale and rounding.
struct RowContext {
  const float* kt;
  const float* vt;
  int64_t keys, n, stride;
  float scale;
  Rounding rounding;
};

// Eight scores from key j on: round(scale · q·k), -inf for the padding past the last key.
template <int D>
SD_AVX2 SD_INLINE __m256 scores8(const RowContext& row, const __m256* q, int64_t j) {
  __m256 acc = _mm256_mul_ps(q[0], _mm256_loadu_ps(row.kt + j));
  SD_UNROLL_CHANNELS
  for (int c = 1; c < D; ++c) acc = _mm256_fmadd_ps(q[c], _mm256_loadu_ps(row.kt + c * row.stride + j), acc);
  acc = _mm256_mul_ps(acc, _mm256_set1_ps(row.scale));
  if (row.rounding.scores) acc = round_to_bf16(acc);
  if (j + kLanes <= row.keys) return acc;
  const __m256 lane =
      _mm256_add_ps(_mm256_set1_ps(static_cast<float>(j)), _mm256_setr_ps(0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f));
  const __m256 padding = _mm256_cmp_ps(lane, _mm256_set1_ps(static_cast<float>(row.keys)), _CMP_GE_OQ);
  return _mm256_blendv_ps(acc, _mm256_set1_ps(-INFINITY), padding);
}

template <int D>
SD_AVX2 SD_INLINE void broadcast(const float* x, __m256* out) {
  SD_UNROLL_CHANNELS
  for (int c = 0; c < D; ++c) out[c] = _mm256_set1_ps(x[c]);
}

template <int D>
SD_AVX2 SD_INLINE void store_sums(const __m256* acc, float* out) {
  SD_UNROLL_CHANNELS
  for (int c = 0; c < D; ++c) out[c] = horizontal_sum(acc[c]);
}

// What backward needs to recompute a row's probabilities: its largest score and 1 / Σ exp(score - max).
struct RowStats {
  float max, inverse_sum;
};

SD_AVX2 SD_INLINE __m256 probabilities8(__m256 scores, const RowStats& stats, const Rounding& rounding) {
  const __m256 p =
      _mm256_mul_ps(exp8(_mm256_sub_ps(scores, _mm256_set1_ps(stats.max))), _mm256_set1_ps(stats.inverse_sum));
  return rounding.probabilities ? round_to_bf16(p) : p;
}

// out = softmax(scores) v for query row q_row; `buffer` holds n floats. `kept` (n floats, or null) receives the
// row's probabilities for backward.
template <int D>
SD_AVX2 RowStats forward_row(const RowContext& row, const float* q_row, float* buffer, float* out, float* kept) {
  __m256 q[D];
  broadcast<D>(q_row, q);
  __m256 max = _mm256_set1_ps(-INFINITY);
  for (int64_t j = 0; j < row.n; j += kLanes) {
    const __m256 s = scores8<D>(row, q, j);
    _mm256_storeu_ps(buffer + j, s);
    max = _mm256_max_ps(max, s);
  }
  RowStats stats{horizontal_max(max), 1.f};
  const __m256 row_max = _mm256_set1_ps(stats.max);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t j = 0; j < row.n; j += kLanes) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(buffer + j), row_max));
    _mm256_storeu_ps(buffer + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  stats.inverse_sum = 1.f / horizontal_sum(sum);
  const __m256 inverse_sum = _mm256_set1_ps(stats.inverse_sum);
  __m256 acc[D];
  SD_UNROLL_CHANNELS
  for (int c = 0; c < D; ++c) acc[c] = _mm256_setzero_ps();
  for (int64_t j = 0; j < row.n; j += kLanes) {
    __m256 p = _mm256_mul_ps(_mm256_loadu_ps(buffer + j), inverse_sum);
    if (row.rounding.probabilities) p = round_to_bf16(p);
    if (kept) _mm256_storeu_ps(kept + j, p);
    SD_UNROLL_CHANNELS
    for (int c = 0; c < D; ++c) acc[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(row.vt + c * row.stride + j), acc[c]);
  }
  store_sums<D>(acc, out);
  return stats;
}

// One query row's share of the backward pass: writes dq_row, adds to dkt and dvt ([channel][key] like kt and vt).
// `kept` holds the row's probabilities as forward kept them, or is null: then they are recomputed into `buffer`.
// `buffer` and `d_scores` hold n floats each.
template <int D>
SD_AVX2 void backward_row(const RowContext& row, const RowStats& stats, const float* q_row, const float* d_out_row,
                          const float* kept, float* buffer, float* d_scores, float* dq_row, float* dkt, float* dvt) {
  __m256 q[D], d_out[D];
  broadcast<D>(q_row, q);
  broadcast<D>(d_out_row, d_out);
  // P, dP = d_out vᵀ, and Σ P ∘ dP.
  __m256 dot = _mm256_setzero_ps();
  for (int64_t j = 0; j < row.n; j += kLanes) {
    const __m256 p = kept ? _mm256_loadu_ps(kept + j) : probabilities8(scores8<D>(row, q, j), stats, row.rounding);
    __m256 dp = _mm256_mul_ps(d_out[0], _mm256_loadu_ps(row.vt + j));
    SD_UNROLL_CHANNELS
    for (int c = 1; c < D; ++c) dp = _mm256_fmadd_ps(d_out[c], _mm256_loadu_ps(row.vt + c * row.stride + j), dp);
    if (!kept) _mm256_storeu_ps(buffer + j, p);
    _mm256_storeu_ps(d_scores + j, dp);
    dot = _mm256_fmadd_ps(p, dp, dot);
  }
  // dS = P ∘ (dP - Σ P ∘ dP) · scale, then dq += dS k, dk += dSᵀ q, dv += Pᵀ d_out.
  const float* probs = kept ? kept : buffer;
  const __m256 row_dot = _mm256_set1_ps(horizontal_sum(dot)), scale = _mm256_set1_ps(row.scale);
  __m256 dq[D];
  SD_UNROLL_CHANNELS
  for (int c = 0; c < D; ++c) dq[c] = _mm256_setzero_ps();
  for (int64_t j = 0; j < row.n; j += kLanes) {
    const __m256 p = _mm256_loadu_ps(probs + j);
    const __m256 ds = _mm256_mul_ps(_mm256_mul_ps(p, _mm256_sub_ps(_mm256_loadu_ps(d_scores + j), row_dot)), scale);
    SD_UNROLL_CHANNELS
    for (int c = 0; c < D; ++c) {
      dq[c] = _mm256_fmadd_ps(ds, _mm256_loadu_ps(row.kt + c * row.stride + j), dq[c]);
      float* dk = dkt + c * row.stride + j;
      _mm256_storeu_ps(dk, _mm256_fmadd_ps(ds, q[c], _mm256_loadu_ps(dk)));
      float* dv = dvt + c * row.stride + j;
      _mm256_storeu_ps(dv, _mm256_fmadd_ps(p, d_out[c], _mm256_loadu_ps(dv)));
    }
  }
  store_sums<D>(dq, dq_row);
}

// ---------------------------------------------------------------------------------------------------------------
// One batch x head slice.

struct Problem {
  int64_t batch, heads, queries, keys, d;
  int64_t n;  // keys rounded up to whole vectors
  // Floats from one channel's keys to the next in a transposed slice: n and one cache line more, so that the D
  // channel rows never fall into the same cache sets (at n = 1024 they would all be 4 KiB apart: measured 3.5x
  // slower per score).
  int64_t stride;
  float scale;
  Rounding rounding;
};

// Where slice (b, h) starts in a [B, L, heads*D] tensor, and the distance between its rows.
template <typename T>
struct SliceOf {
  T* first;
  int64_t row_stride;
  SliceOf(T* data, const Problem& p, int64_t b, int64_t h, int64_t rows)
      : first(data + (b * rows * p.heads + h) * p.d), row_stride(p.heads * p.d) {}
  T* row(int64_t i) const { return first + i * row_stride; }
};

// [rows][D] of a slice -> [D][stride] float32, zero past `rows`.
template <int D, typename T>
void load_transposed(const SliceOf<const T>& x, int64_t rows, int64_t stride, float* out) {
  std::fill(out, out + D * stride, 0.f);
  for (int64_t j = 0; j < rows; ++j)
    for (int c = 0; c < D; ++c) out[c * stride + j] = static_cast<float>(x.row(j)[c]);
}

template <int D, typename T>
void store_transposed(const float* in, int64_t rows, int64_t stride, const SliceOf<T>& x) {
  for (int64_t j = 0; j < rows; ++j)
    for (int c = 0; c < D; ++c) x.row(j)[c] = static_cast<T>(in[c * stride + j]);
}

template <int D, typename From, typename To>
void convert_row(const From* x, To* out) {
  for (int c = 0; c < D; ++c) out[c] = static_cast<To>(x[c]);
}

template <typename T>
struct Tensors {
  const T *q, *k, *v;
};

// A slice's keys and values, transposed to [D][stride] float32.
struct KeysAndValues {
  std::vector<float> kt, vt;
  template <int D, typename T>
  static KeysAndValues of(const Problem& p, const Tensors<T>& in, int64_t b, int64_t h) {
    KeysAndValues kv{std::vector<float>(D * p.stride), std::vector<float>(D * p.stride)};
    load_transposed<D>(SliceOf<const T>(in.k, p, b, h, p.keys), p.keys, p.stride, kv.kt.data());
    load_transposed<D>(SliceOf<const T>(in.v, p, b, h, p.keys), p.keys, p.stride, kv.vt.data());
    return kv;
  }
  RowContext row_context(const Problem& p) const {
    return {kt.data(), vt.data(), p.keys, p.n, p.stride, p.scale, p.rounding};
  }
};

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
    stats[i] = forward_row<D>(row, q_row, buffer.data(), out_row, kept ? kept + i * p.n : nullptr);
    convert_row<D>(out_row, o.row(i));
  }
}

template <typename T>
struct Gradients {
  T *dq, *dk, *dv;
};

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
    backward_row<D>(row, stats[i], q_row, d_out_row, kept ? kept + i * p.n : nullptr, buffer.data(), d_scores.data(),
                    dq_row, dkt.data(), dvt.data());
    convert_row<D>(dq_row, dq.row(i));
  }
  store_transposed<D>(dkt.data(), p.keys, p.stride, SliceOf<T>(grads.dk, p, b, h, p.keys));
  store_transposed<D>(dvt.data(), p.keys, p.stride, SliceOf<T>(grads.dv, p, b, h, p.keys));
}

// Calls fn(std::integral_constant<int, D>) for D = d, one of 1 ... kMaxHeadChannels: the row loops unroll over the
// channels and keep their per-channel sums in registers.
template <int D = 1, typename Fn>
void with_head_channels(int64_t d, const Fn& fn) {
  if constexpr (D <= kMaxHeadChannels) {
    if (d == D) return fn(std::integral_constant<int, D>());
    with_head_channels<D + 1>(d, fn);
  }
}

// Runs fn(b, h) for every slice, spread over LibTorch's threads; slices write disjoint parts of every output.
template <typename Fn>
void for_each_slice(const Problem& p, const Fn& fn) {
  sd::parallel_for(0, p.batch * p.heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) fn(s / p.heads, s % p.heads);
  });
}

// Calls fn(T()) with T the C++ type of `dtype`, float32 or bf16.
template <typename Fn>
void with_element_type(at::ScalarType dtype, const Fn& fn) {
  if (dtype == at::kBFloat16) return fn(c10::BFloat16());
  fn(0.f);
}

template <typename T>
Tensors<T> tensors_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return {q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>()};
}

class SmallHeadAttention : public torch::autograd::Function<SmallHeadAttention> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                            const at::Tensor& v_in, int64_t heads, double scale, bool upcast_attention) {
    RECORD_USER_SCOPE_WITH_INPUTS("sdtrain::attention", std::vector<c10::IValue>({q_in, k_in, v_in}));
    const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
    const Problem p = problem(q, k, heads, scale, upcast_attention);
    at::Tensor out = at::empty_like(q);
    at::Tensor stats = at::empty({p.batch, heads, p.queries, 2}, q.options().dtype(at::kFloat));
    auto* row_stats = reinterpret_cast<RowStats*>(stats.data_ptr<float>());
    const bool training = q_in.requires_grad() || k_in.requires_grad() || v_in.requires_grad();
    const at::Tensor kept = training && keeps_probabilities(p)
                                ? at::empty({p.batch * heads, p.queries, p.n}, q.options().dtype(at::kFloat))
                                : at::Tensor();
    with_element_type(q.scalar_type(), [&](auto zero) {
      using T = decltype(zero);
      with_head_channels(p.d, [&](auto d) {
        for_each_slice(p, [&](int64_t b, int64_t h) {
          const int64_t slice = b * heads + h;
          forward_slice<d()>(p, tensors_of<T>(q, k, v), b, h, out.data_ptr<T>(), row_stats + slice * p.queries,
                             kept.defined() ? kept.data_ptr<float>() + slice * p.queries * p.n : nullptr);
        });
      });
    });
    ctx->save_for_backward({q, k, v, stats, kept});  // released once this node's backward has run
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["upcast"] = upcast_attention;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &stats = saved[3], &kept = saved[4];
    RECORD_USER_SCOPE_WITH_INPUTS("sdtrain::attention_backward", std::vector<c10::IValue>({q, k, v}));
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const Problem p = problem(q, k, heads, ctx->saved_data["scale"].toDouble(), ctx->saved_data["upcast"].toBool());
    const at::Tensor d_out = grad_outputs[0].to(v.scalar_type()).contiguous();
    at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
    const auto* row_stats = reinterpret_cast<const RowStats*>(stats.data_ptr<float>());
    with_element_type(q.scalar_type(), [&](auto zero) {
      using T = decltype(zero);
      const Gradients<T> grads{dq.data_ptr<T>(), dk.data_ptr<T>(), dv.data_ptr<T>()};
      with_head_channels(p.d, [&](auto d) {
        for_each_slice(p, [&](int64_t b, int64_t h) {
          const int64_t slice = b * heads + h;
          backward_slice<d()>(p, tensors_of<T>(q, k, v), d_out.data_ptr<T>(), row_stats + slice * p.queries,
                              kept.defined() ? kept.data_ptr<float>() + slice * p.queries * p.n : nullptr, b, h, grads);
        });
      });
    });
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor()};
  }

 private:
  // Whether forward keeps the probabilities for backward: when they take at most 16 MiB (tiny-sd1's largest
  // attention at 64² holds 4 MiB). Backward then skips recomputing the scores and their exponentials, most of its
  // work at 4-8 channels per head; larger problems recompute, to keep only q, k and v.
  static bool keeps_probabilities(const Problem& p) {
    constexpr int64_t kMostKeptProbabilities = int64_t{1} << 22;
    return p.batch * p.heads * p.queries * p.n <= kMostKeptProbabilities;
  }

  static Problem problem(const at::Tensor& q, const at::Tensor& k, int64_t heads, double scale, bool upcast_attention) {
    const bool bf16 = q.scalar_type() == at::kBFloat16;
    const int64_t n = (k.size(1) + kLanes - 1) / kLanes * kLanes;
    return {q.size(0),
            heads,
            q.size(1),
            k.size(1),
            q.size(2) / heads,
            n,
            n + 64 / static_cast<int64_t>(sizeof(float)),
            static_cast<float>(scale),
            {bf16 && !upcast_attention, bf16}};
  }
};

}  // namespace

bool small_head_attention_fits(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads) {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const auto dtype = q.scalar_type();
  return avx2 && q.device().is_cpu() && (dtype == at::kFloat || dtype == at::kBFloat16) && k.scalar_type() == dtype &&
         v.scalar_type() == dtype && q.dim() == 3 && heads > 0 && q.size(2) % heads == 0 &&
         q.size(2) / heads <= kMaxHeadChannels;
}

at::Tensor small_head_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                                double scale, bool upcast_attention) {
  SD_CHECK(small_head_attention_fits(q, k, v, heads),
           "small_head_attention: expected float32 or bf16 CPU tensors of one dtype with at most {} channels per head "
           "on an AVX2 CPU, got {} q [{}], {} k, {} v for {} heads",
           kMaxHeadChannels, c10::toString(q.scalar_type()), fmt::join(q.sizes(), ", "), c10::toString(k.scalar_type()),
           c10::toString(v.scalar_type()), heads);
  SD_CHECK(k.dim() == 3 && k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(2) == q.size(2),
           "small_head_attention: expected q [B, Lq, C], k and v [B, Lk, C], got [{}], [{}], [{}]",
           fmt::join(q.sizes(), ", "), fmt::join(k.sizes(), ", "), fmt::join(v.sizes(), ", "));
  return SmallHeadAttention::apply(q, k, v, heads, scale, upcast_attention);
}

}  // namespace sd::models
