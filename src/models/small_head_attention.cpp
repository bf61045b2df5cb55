#include "models/small_head_attention.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/simd.h"
#include "models/attention_tiles.h"
#include "perf/op_profiler.h"

namespace sd::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kMaxHeadChannels = 16;
// Keys are padded to a multiple of the widest vector (16 floats in AVX-512), whichever width runs; the padding's
// scores are -inf, so it adds exact zeros.
constexpr int64_t kKeyPadding = 16;
// Backward over kept probabilities sums dk and dv in D vector registers each (sum_over_rows); beyond 8 channels
// those would not fit beside its operands in AVX2's sixteen, and backward_row's order takes over.
constexpr int64_t kMostSweptHeadChannels = 8;

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

// The kernels, once per vector width (small_head_attention_rows.inl, against core/simd.h's operations): the same
// source compiles to AVX2 code in one namespace and to AVX-512 code in the other; the CPU decides which runs.
#define SD_KERNELS "models/small_head_attention_rows.inl"
#include "core/simd_each_width.inl"

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

template <typename T>
Tensors<T> tensors_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return {q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>()};
}

class SmallHeadAttention : public torch::autograd::Function<SmallHeadAttention> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                            const at::Tensor& v_in, int64_t heads, double scale, bool upcast_attention, bool causal,
                            bool keep_probabilities) {
    RECORD_USER_SCOPE_WITH_INPUTS("sdtrain::attention", std::vector<c10::IValue>({q_in, k_in, v_in}));
    const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
    const Problem p = problem(q, k, heads, scale, upcast_attention, causal);
    at::Tensor out = at::empty_like(q);
    at::Tensor stats = at::empty({p.batch, heads, p.queries, 2}, q.options().dtype(at::kFloat));
    auto* row_stats = reinterpret_cast<RowStats*>(stats.data_ptr<float>());
    const bool training = q_in.requires_grad() || k_in.requires_grad() || v_in.requires_grad();
    const at::Tensor kept = training && keep_probabilities && small_enough_to_keep(p)
                                ? at::empty({p.batch * heads, p.queries, p.n}, q.options().dtype(at::kFloat))
                                : at::Tensor();
    const bool wide = sd::kernel_vector_bits() == 512;
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
    const bool wide = sd::kernel_vector_bits() == 512;
    with_element_type(q.scalar_type(), [&](auto zero) {
      using T = decltype(zero);
      const Gradients<T> grads{dq.data_ptr<T>(), dk.data_ptr<T>(), dv.data_ptr<T>()};
      with_head_channels(p.d, [&](auto d) {
        const auto backward_slice = wide ? &avx512::backward_slice<d(), T> : &avx2::backward_slice<d(), T>;
        const auto backward_kept_slice =
            wide ? &avx512::backward_kept_slice<d(), T> : &avx2::backward_kept_slice<d(), T>;
        const bool sweeps = kept.defined() && d() <= kMostSweptHeadChannels;
        for_each_slice(p, [&](int64_t b, int64_t h) {
          const int64_t slice = b * heads + h;
          const float* kept_slice = kept.defined() ? kept.data_ptr<float>() + slice * p.queries * p.n : nullptr;
          if (sweeps)
            backward_kept_slice(p, tensors_of<T>(q, k, v), d_out.data_ptr<T>(), kept_slice, b, h, grads);
          else
            backward_slice(p, tensors_of<T>(q, k, v), d_out.data_ptr<T>(), row_stats + slice * p.queries, kept_slice, b,
                           h, grads);
        });
      });
    });
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }

 private:
  // Whether forward keeps the probabilities for backward: when they take at most 16 MiB (tiny-sd1's largest
  // attention at 64² holds 4 MiB). Backward then skips recomputing the scores and their exponentials, most of its
  // work at 4-8 channels per head; larger problems recompute, to keep only q, k and v.
  static bool small_enough_to_keep(const Problem& p) {
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

}  // namespace

bool small_head_attention_fits(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads) {
  const auto dtype = q.scalar_type();
  return sd::cpu_has_avx2_fma() && q.device().is_cpu() && (dtype == at::kFloat || dtype == at::kBFloat16) &&
         k.scalar_type() == dtype && v.scalar_type() == dtype && q.dim() == 3 && heads > 0 && q.size(2) % heads == 0 &&
         q.size(2) / heads <= kMaxHeadChannels;
}

at::Tensor small_head_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                                double scale, bool upcast_attention, bool causal, bool keep_probabilities) {
  SD_CHECK(small_head_attention_fits(q, k, v, heads),
           "small_head_attention: expected float32 or bf16 CPU tensors of one dtype with at most {} channels per head "
           "on an AVX2 CPU, got {} q [{}], {} k, {} v for {} heads",
           kMaxHeadChannels, c10::toString(q.scalar_type()), fmt::join(q.sizes(), ", "), c10::toString(k.scalar_type()),
           c10::toString(v.scalar_type()), heads);
  SD_CHECK(k.dim() == 3 && k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(2) == q.size(2),
           "small_head_attention: expected q [B, Lq, C], k and v [B, Lk, C], got [{}], [{}], [{}]",
           fmt::join(q.sizes(), ", "), fmt::join(k.sizes(), ", "), fmt::join(v.sizes(), ", "));
  return SmallHeadAttention::apply(q, k, v, heads, scale, upcast_attention, causal, keep_probabilities);
}

}  // namespace sd::models
