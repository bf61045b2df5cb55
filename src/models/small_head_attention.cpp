#include "models/small_head_attention.h"

#include <immintrin.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
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
// Keys are padded to a multiple of the widest vector (16 floats in AVX-512), whichever width runs; the padding's
// scores are -inf, so it adds exact zeros.
constexpr int64_t kKeyPadding = 16;

#define SD_INLINE __attribute__((always_inline)) inline
// GCC at -O2 keeps loops over the D channels rolled, and with them the per-channel sums in memory (measured: a
// store-to-load round trip per multiply-add, 2x slower rows).
#define SD_UNROLL_CHANNELS _Pragma("GCC unroll 16")

// ---------------------------------------------------------------------------------------------------------------
// What every row kernel reads.

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

// What backward needs to recompute a row's probabilities: its largest score and 1 / Σ exp(score - max).
struct RowStats {
  float max, inverse_sum;
};

// ---------------------------------------------------------------------------------------------------------------
// One batch x head slice.

int64_t padded(int64_t keys) { return (keys + kKeyPadding - 1) / kKeyPadding * kKeyPadding; }

struct Problem {
  int64_t batch, heads, queries, keys, d;
  int64_t n;  // padded(keys)
  // Floats from one channel's keys to the next in a transposed slice: n and one cache line more, so that the D
  // channel rows never fall into the same cache sets (at n = 1024 they would all be 4 KiB apart: measured 3.5x
  // slower per score).
  int64_t stride;
  float scale;
  Rounding rounding;
  bool causal;  // query i sees keys 0 ... i only
};

// Query row i's context from its slice's: every key, or under a causal mask keys 0 ... i, whose loops stop at the
// padded vector holding key i (the masked keys' probabilities are exact zeros, so skipping them changes nothing).
RowContext context_of_row(RowContext row, const Problem& p, int64_t i) {
  if (p.causal) {
    row.keys = std::min(i + 1, p.keys);
    row.n = padded(row.keys);
  }
  return row;
}

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

template <typename T>
struct Gradients {
  T *dq, *dk, *dv;
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

// ---------------------------------------------------------------------------------------------------------------
// The kernels, once per vector width (small_head_attention_rows.inl). Each width's namespace defines its vector
// operations and includes the kernels under a target pragma for its instruction set (GCC's `target`, clang's
// `attribute push`: the fuzz build uses clang), so that the same source compiles to AVX2 code in one namespace and
// to AVX-512 code in the other; the CPU decides which runs.
//
// exp(x) in both: Cephes' expf (x = n·ln2 + r with |r| ≤ ln2/2, 2^n from the exponent bits, e^r from a degree-7
// polynomial), within 2 ulp of std::exp. Below -87.3, where float32's exp leaves the normal range, and for -inf it
// gives 0; NaN stays NaN (min and max return their second operand when one is NaN).
constexpr float kExpLowest = -87.3f, kExpHighest = 88.3f, kLog2e = 1.44269504088896341f;
constexpr float kLn2High = 0.693359375f, kLn2Low = -2.12194440e-4f;  // ln2 split so that n·kLn2High is exact
constexpr float kExpPolynomial[] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                    4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

namespace avx2 {
#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

using Vec = __m256;
constexpr int64_t kLanes = 8;

SD_INLINE Vec load(const float* p) { return _mm256_loadu_ps(p); }
SD_INLINE void store(float* p, Vec x) { _mm256_storeu_ps(p, x); }
SD_INLINE Vec splat(float x) { return _mm256_set1_ps(x); }
SD_INLINE Vec zero() { return _mm256_setzero_ps(); }
SD_INLINE Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
SD_INLINE Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
SD_INLINE Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
SD_INLINE Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
SD_INLINE Vec fnmadd(Vec a, Vec b, Vec c) { return _mm256_fnmadd_ps(a, b, c); }
SD_INLINE Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }

SD_INLINE Vec exp(Vec x) {
  const Vec underflows = _mm256_cmp_ps(x, splat(kExpLowest), _CMP_LT_OQ);
  x = _mm256_min_ps(splat(kExpHighest), max(splat(kExpLowest), x));
  const Vec n = _mm256_round_ps(mul(x, splat(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const Vec r = fnmadd(n, splat(kLn2Low), fnmadd(n, splat(kLn2High), x));
  Vec p = splat(kExpPolynomial[0]);
  for (int i = 1; i < 6; ++i) p = fmadd(p, r, splat(kExpPolynomial[i]));
  p = fmadd(p, mul(r, r), add(r, splat(1.f)));
  const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflows, mul(p, _mm256_castsi256_ps(exponent)));
}

// x rounded to the nearest bf16 (ties to even) and widened back, as storing to bf16 and loading again would.
SD_INLINE Vec round_to_bf16(Vec x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  return _mm256_castsi256_ps(_mm256_and_si256(rounded, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

SD_INLINE float horizontal_sum(Vec x) {
  const __m128 pairs = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  const __m128 twos = _mm_add_ps(pairs, _mm_movehl_ps(pairs, pairs));
  return _mm_cvtss_f32(_mm_add_ss(twos, _mm_movehdup_ps(twos)));
}

SD_INLINE float horizontal_max(Vec x) {
  const __m128 pairs = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  const __m128 twos = _mm_max_ps(pairs, _mm_movehl_ps(pairs, pairs));
  return _mm_cvtss_f32(_mm_max_ss(twos, _mm_movehdup_ps(twos)));
}

SD_INLINE Vec minus_infinity_past(Vec x, int64_t first, int64_t keys) {
  const Vec lane = add(splat(static_cast<float>(first)), _mm256_setr_ps(0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f));
  return _mm256_blendv_ps(x, splat(-INFINITY), _mm256_cmp_ps(lane, splat(static_cast<float>(keys)), _CMP_GE_OQ));
}

#include "models/small_head_attention_rows.inl"

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
}  // namespace avx2

namespace avx512 {
#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which it then reports as used uninitialized (GCC bug
// 105593, fixed in GCC 13): false positives at every inlined intrinsic.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

using Vec = __m512;
constexpr int64_t kLanes = 16;

SD_INLINE Vec load(const float* p) { return _mm512_loadu_ps(p); }
SD_INLINE void store(float* p, Vec x) { _mm512_storeu_ps(p, x); }
SD_INLINE Vec splat(float x) { return _mm512_set1_ps(x); }
SD_INLINE Vec zero() { return _mm512_setzero_ps(); }
SD_INLINE Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
SD_INLINE Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
SD_INLINE Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
SD_INLINE Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
SD_INLINE Vec fnmadd(Vec a, Vec b, Vec c) { return _mm512_fnmadd_ps(a, b, c); }
SD_INLINE Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }

SD_INLINE Vec exp(Vec x) {
  const __mmask16 underflows = _mm512_cmp_ps_mask(x, splat(kExpLowest), _CMP_LT_OQ);
  x = _mm512_min_ps(splat(kExpHighest), max(splat(kExpLowest), x));
  const Vec n = _mm512_roundscale_ps(mul(x, splat(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const Vec r = fnmadd(n, splat(kLn2Low), fnmadd(n, splat(kLn2High), x));
  Vec p = splat(kExpPolynomial[0]);
  for (int i = 1; i < 6; ++i) p = fmadd(p, r, splat(kExpPolynomial[i]));
  p = fmadd(p, mul(r, r), add(r, splat(1.f)));
  const __m512i exponent = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~underflows), mul(p, _mm512_castsi512_ps(exponent)));
}

SD_INLINE Vec round_to_bf16(Vec x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  return _mm512_castsi512_ps(_mm512_and_si512(rounded, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

SD_INLINE __m256 upper_half(Vec x) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)); }

// The halves' sum (or maximum), then AVX2's eight lanes: the same association as avx2's on each half.
SD_INLINE float horizontal_sum(Vec x) {
  return avx2::horizontal_sum(_mm256_add_ps(_mm512_castps512_ps256(x), upper_half(x)));
}

SD_INLINE float horizontal_max(Vec x) {
  return avx2::horizontal_max(_mm256_max_ps(_mm512_castps512_ps256(x), upper_half(x)));
}

SD_INLINE Vec minus_infinity_past(Vec x, int64_t first, int64_t keys) {
  const int64_t valid = keys - first;  // < 16 here
  const __mmask16 padding = static_cast<__mmask16>(valid <= 0 ? 0xFFFF : 0xFFFF << valid);
  return _mm512_mask_blend_ps(padding, x, splat(-INFINITY));
}

#include "models/small_head_attention_rows.inl"

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
}  // namespace avx512

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
                            const at::Tensor& v_in, int64_t heads, double scale, bool upcast_attention, bool causal) {
    RECORD_USER_SCOPE_WITH_INPUTS("sdtrain::attention", std::vector<c10::IValue>({q_in, k_in, v_in}));
    const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
    const Problem p = problem(q, k, heads, scale, upcast_attention, causal);
    at::Tensor out = at::empty_like(q);
    at::Tensor stats = at::empty({p.batch, heads, p.queries, 2}, q.options().dtype(at::kFloat));
    auto* row_stats = reinterpret_cast<RowStats*>(stats.data_ptr<float>());
    const bool training = q_in.requires_grad() || k_in.requires_grad() || v_in.requires_grad();
    const at::Tensor kept = training && keeps_probabilities(p)
                                ? at::empty({p.batch * heads, p.queries, p.n}, q.options().dtype(at::kFloat))
                                : at::Tensor();
    const bool wide = small_head_attention_vector_bits() == 512;
    with_element_type(q.scalar_type(), [&](auto zero) {
      using T = decltype(zero);
      with_head_channels(p.d, [&](auto d) {
        const auto forward_slice = wide ? &avx512::forward_slice<d(), T> : &avx2::forward_slice<d(), T>;
        for_each_slice(p, [&](int64_t b, int64_t h) {
          const int64_t slice = b * heads + h;
          forward_slice(p, tensors_of<T>(q, k, v), b, h, out.data_ptr<T>(), row_stats + slice * p.queries,
                        kept.defined() ? kept.data_ptr<float>() + slice * p.queries * p.n : nullptr);
        });
      });
    });
    ctx->save_for_backward({q, k, v, stats, kept});  // released once this node's backward has run
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["upcast"] = upcast_attention;
    ctx->saved_data["causal"] = causal;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &stats = saved[3], &kept = saved[4];
    RECORD_USER_SCOPE_WITH_INPUTS("sdtrain::attention_backward", std::vector<c10::IValue>({q, k, v}));
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const Problem p = problem(q, k, heads, ctx->saved_data["scale"].toDouble(), ctx->saved_data["upcast"].toBool(),
                              ctx->saved_data["causal"].toBool());
    const at::Tensor d_out = grad_outputs[0].to(v.scalar_type()).contiguous();
    at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
    const auto* row_stats = reinterpret_cast<const RowStats*>(stats.data_ptr<float>());
    const bool wide = small_head_attention_vector_bits() == 512;
    with_element_type(q.scalar_type(), [&](auto zero) {
      using T = decltype(zero);
      const Gradients<T> grads{dq.data_ptr<T>(), dk.data_ptr<T>(), dv.data_ptr<T>()};
      with_head_channels(p.d, [&](auto d) {
        const auto backward_slice = wide ? &avx512::backward_slice<d(), T> : &avx2::backward_slice<d(), T>;
        for_each_slice(p, [&](int64_t b, int64_t h) {
          const int64_t slice = b * heads + h;
          backward_slice(p, tensors_of<T>(q, k, v), d_out.data_ptr<T>(), row_stats + slice * p.queries,
                         kept.defined() ? kept.data_ptr<float>() + slice * p.queries * p.n : nullptr, b, h, grads);
        });
      });
    });
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }

 private:
  // Whether forward keeps the probabilities for backward: when they take at most 16 MiB (tiny-sd1's largest
  // attention at 64² holds 4 MiB). Backward then skips recomputing the scores and their exponentials, most of its
  // work at 4-8 channels per head; larger problems recompute, to keep only q, k and v.
  static bool keeps_probabilities(const Problem& p) {
    constexpr int64_t kMostKeptProbabilities = int64_t{1} << 22;
    return p.batch * p.heads * p.queries * p.n <= kMostKeptProbabilities;
  }

  static Problem problem(const at::Tensor& q, const at::Tensor& k, int64_t heads, double scale, bool upcast_attention,
                         bool causal) {
    const bool bf16 = q.scalar_type() == at::kBFloat16;
    const int64_t n = padded(k.size(1));
    return {q.size(0),
            heads,
            q.size(1),
            k.size(1),
            q.size(2) / heads,
            n,
            n + 64 / static_cast<int64_t>(sizeof(float)),
            static_cast<float>(scale),
            {bf16 && !upcast_attention, bf16},
            causal};
  }
};

int widest_vector_bits() { return __builtin_cpu_supports("avx512f") ? 512 : 256; }

std::atomic<int> g_vector_bits{widest_vector_bits()};

}  // namespace

int small_head_attention_vector_bits() { return g_vector_bits.load(); }

void set_small_head_attention_vector_bits(int bits) {
  SD_CHECK(bits == 256 || (bits == 512 && widest_vector_bits() == 512),
           "small_head_attention: vector width {} bits: expected 256 or, on a CPU with AVX-512F, 512", bits);
  g_vector_bits = bits;
}

bool small_head_attention_fits(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads) {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const auto dtype = q.scalar_type();
  return avx2 && q.device().is_cpu() && (dtype == at::kFloat || dtype == at::kBFloat16) && k.scalar_type() == dtype &&
         v.scalar_type() == dtype && q.dim() == 3 && heads > 0 && q.size(2) % heads == 0 &&
         q.size(2) / heads <= kMaxHeadChannels;
}

at::Tensor small_head_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                                double scale, bool upcast_attention, bool causal) {
  SD_CHECK(small_head_attention_fits(q, k, v, heads),
           "small_head_attention: expected float32 or bf16 CPU tensors of one dtype with at most {} channels per head "
           "on an AVX2 CPU, got {} q [{}], {} k, {} v for {} heads",
           kMaxHeadChannels, c10::toString(q.scalar_type()), fmt::join(q.sizes(), ", "), c10::toString(k.scalar_type()),
           c10::toString(v.scalar_type()), heads);
  SD_CHECK(k.dim() == 3 && k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(2) == q.size(2),
           "small_head_attention: expected q [B, Lq, C], k and v [B, Lk, C], got [{}], [{}], [{}]",
           fmt::join(q.sizes(), ", "), fmt::join(k.sizes(), ", "), fmt::join(v.sizes(), ", "));
  return SmallHeadAttention::apply(q, k, v, heads, scale, upcast_attention, causal);
}

}  // namespace sd::models
