#include "models/wide_head_attention.h"

#include <oneapi/dnnl/dnnl.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/kernel_call.h"
#include "core/onednn_matmul.h"
#include "core/simd.h"
#include "models/attention_tiles.h"
#include "models/head_layout.h"
#include "perf/op_profiler.h"

namespace sd::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Row-major C = alpha · op(A) op(B) + beta · C, single-threaded inside the blocks' parallel loop: oneDNN's sgemm for
// float32; for bf16 operands oneDNN's bf16 products (core/onednn_matmul.h), summed in float32 and written as float32
// or, rounded once, as bf16.
void gemm(char trans_a, char trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const dnnl_status_t status = dnnl_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  // The shapes come from tensors checked in wide_head_attention: a failure here is a bug, not bad input.
  SD_CHECK(status == dnnl_success, "wide_head_attention: oneDNN sgemm failed with status {}", static_cast<int>(status));
}
void gemm(char trans_a, char trans_b, int64_t m, int64_t n, int64_t k, float alpha, const c10::BFloat16* a, int64_t lda,
          const c10::BFloat16* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  sd::gemm_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void gemm(char trans_a, char trans_b, int64_t m, int64_t n, int64_t k, float alpha, const c10::BFloat16* a, int64_t lda,
          const c10::BFloat16* b, int64_t ldb, float beta, c10::BFloat16* c, int64_t ldc) {
  SD_CHECK(beta == 0.f, "wide_head_attention: a bf16 product cannot add to its output");
  sd::gemm_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc);
}

// Query rows per block, for 256 KiB of scores: from 64 to 256 rows whatever the keys. bench_attention, SD-1.5 and
// SD-2 shapes: 32 rows are up to 1.5x slower at every size (oneDNN packs the keys for every block), 64 rows are best
// from 1024 keys up (their probabilities and gradients, 2 x 1 MiB at 4096 keys, stay in L2), 128-256 rows below that.
int64_t block_rows(int64_t queries, int64_t keys) { return tile_rows_for(queries, keys, 64, 256); }

// What backward needs to recompute a row's probabilities from its scores: the row's largest score and the
// reciprocal of Σ exp(score - max).
struct RowStats {
  float max, inverse_sum;
};

// The shapes of one call: q [batch, queries, heads*d], k and v [batch, keys, heads*d]; in bf16 with each head's rows
// together, as [batch*heads, queries or keys, d] (kernel_layout).
struct Problem {
  int64_t batch, heads, queries, keys, d;
  int64_t block_rows;  // query rows per block
  float scale;
  bool round_scores;  // to bf16 before the softmax, as diffusers' bf16 baddbmm writes them (not under upcast_attention)
  bool heads_first;   // the [batch*heads, L, d] layout

  int64_t row_stride() const { return heads_first ? d : heads * d; }
  // Where head h's first row is in a batch entry of `rows` rows.
  int64_t head_offset(int64_t h, int64_t rows) const { return heads_first ? h * rows * d : h * d; }
};

// Query rows [row, row + rows) of head h of batch entry b.
struct Block {
  int64_t b, h, row, rows;

  static Block of(const Problem& p, const Tile& t) { return {t.bh / p.heads, t.bh % p.heads, t.row, t.rows}; }
  // The block's first element in a q-, k- or v-shaped tensor of `rows_per_entry` rows per batch entry.
  template <typename T>
  T* rows_of(T* data, const Problem& p, int64_t rows_per_entry, int64_t first_row) const {
    return data + b * rows_per_entry * p.heads * p.d + p.head_offset(h, rows_per_entry) + first_row * p.row_stride();
  }
  template <typename T>
  T* queries_of(T* data, const Problem& p) const {
    return rows_of(data, p, p.queries, row);
  }
  template <typename T>
  T* keys_of(T* data, const Problem& p) const {
    return rows_of(data, p, p.keys, 0);
  }
  // The block's probabilities in a [batch*heads, queries, keys] buffer.
  template <typename T>
  T* probabilities_of(T* data, const Problem& p) const {
    return data + ((b * p.heads + h) * p.queries + row) * p.keys;
  }
  // The block's row statistics in a [batch*heads, queries, 2] buffer.
  RowStats* row_stats_of(float* data, const Problem& p) const {
    return reinterpret_cast<RowStats*>(data) + (b * p.heads + h) * p.queries + row;
  }
};

// Runs fn(block, thread) for every block, spread over LibTorch's threads.
template <typename Fn>
void for_each_block(const Problem& p, const Fn& fn) {
  for_each_tile(p.batch * p.heads, p.queries, p.block_rows,
                [&](const Tile& t, int thread) { fn(Block::of(p, t), thread); });
}

// The row softmax, its recomputation and its backward, once per vector width (wide_head_softmax_rows.inl, against
// core/simd.h's operations). LibTorch's own softmax kernels take their AVX2 code on AVX-512 CPUs, call Sleef's exp per
// vector and are dispatched once per block: a fifth of this kernel's time under perf at SD-2's 64x64 self-attention.
#define SD_KERNELS "models/wide_head_softmax_rows.inl"
#include "core/simd_each_width.inl"

// The rows' element types: float32, or bf16 as its bits.
float* row_values(float* x) { return x; }
const float* row_values(const float* x) { return x; }
uint16_t* row_values(c10::BFloat16* x) { return reinterpret_cast<uint16_t*>(x); }
const uint16_t* row_values(const c10::BFloat16* x) { return reinterpret_cast<const uint16_t*>(x); }

template <typename T>
void softmax_rows(const Problem& p, float* scores, T* probs, int64_t rows, RowStats* stats) {
  SD_CALL_KERNEL(softmax_rows, scores, row_values(probs), rows, p.keys, p.round_scores, stats);
}

template <typename T>
void probabilities_rows(const Problem& p, const float* scores, T* probs, const RowStats* stats, int64_t rows) {
  SD_CALL_KERNEL(probabilities_rows, scores, row_values(probs), stats, rows, p.keys, p.round_scores);
}

template <typename T>
void softmax_backward_rows(const Problem& p, const float* d_probs, const T* probs, T* d_scores, int64_t rows) {
  SD_CALL_KERNEL(softmax_backward_rows, d_probs, row_values(probs), row_values(d_scores), rows, p.keys);
}

// One thread's block buffers: the float32 scores and probabilities' gradients, and the probabilities and scores'
// gradients the products read next, in the element type. For float32 those are the float32 rows themselves (the
// softmax and its backward work in place); bf16 has rows of its own. Forward has no gradient rows (null).
template <typename T>
struct BlockBuffers {
  float *scores, *d_probs;
  T *probs, *d_scores;
};

// Every thread's BlockBuffers, as tensors allocated once per call: the gradient rows only for backward.
template <typename T>
class Workspace {
 public:
  enum Pass { kForward = 1, kBackward = 2 };  // the rows per thread of each element type
  Workspace(const Problem& p, const at::TensorOptions& options, Pass pass)
      : row_values_(p.block_rows * p.keys),
        rows_(pass),
        floats_(at::empty({at::get_num_threads(), rows_, row_values_}, options.dtype(at::kFloat))),
        narrow_(kInPlace ? at::Tensor() : at::empty({at::get_num_threads(), rows_, row_values_}, options)) {}

  BlockBuffers<T> of(int thread) const {
    float* scores = floats_.data_ptr<float>() + rows_ * thread * row_values_;
    float* d_probs = rows_ == kBackward ? scores + row_values_ : nullptr;
    if constexpr (kInPlace) {
      return {scores, d_probs, scores, d_probs};
    } else {
      T* probs = narrow_.data_ptr<T>() + rows_ * thread * row_values_;
      return {scores, d_probs, probs, rows_ == kBackward ? probs + row_values_ : nullptr};
    }
  }

 private:
  static constexpr bool kInPlace = std::is_same_v<T, float>;
  int64_t row_values_;  // block_rows x keys
  int64_t rows_;
  at::Tensor floats_, narrow_;
};

// A block's scores q kᵀ · scale into `scores` [rows, keys].
template <typename T>
void block_scores(const Problem& p, const Block& blk, const T* q, const T* k, float* scores) {
  const int64_t ld = p.row_stride();
  gemm('N', 'T', blk.rows, p.keys, p.d, p.scale, blk.queries_of(q, p), ld, blk.keys_of(k, p), ld, 0.f, scores, p.keys);
}

// The right operand of a product that has a head's channels as its columns (P·v, and dS·k in backward), as those
// products read it: the kernel-layout rows themselves, or for bf16 heads whose width is not a multiple of 16 a copy
// padded with zero channels up to the next one, so that oneDNN's kernels fill whole vectors of outputs. One thread,
// [64, 4096] x [4096, 40] (SD-1.5's 40-channel heads at 64x64): 9.85 ms, and 7.65 ms with 48 channels, the first 40
// the same bits; padding q kᵀ's inner dimension instead slows it down (7.54 -> 8.55 ms).
struct ChannelColumns {
  at::Tensor rows;
  int64_t width;       // channels per row in `rows`: d, or d padded
  at::Tensor scratch;  // padded only: each thread's output rows [threads, block_rows, width]

  static ChannelColumns of(const at::Tensor& kernel_rows, const Problem& p) {
    if (!p.heads_first || p.d % 16 == 0) return {kernel_rows, p.d, at::Tensor()};
    const int64_t width = (p.d + 15) / 16 * 16;
    return {at::constant_pad_nd(kernel_rows, {0, width - p.d}), width,
            at::empty({at::get_num_threads(), p.block_rows, width}, kernel_rows.options())};
  }
  template <typename T>
  T* scratch_of(int thread) const {
    return scratch.data_ptr<T>() + thread * scratch.size(1) * width;
  }
};

// A·B into the block's `rows` x d output rows at `out` (leading dimension ld), A [rows, keys] and B head (b, h) of
// `columns`: directly where the columns are not padded, else through the thread's scratch rows, from which the d
// channels are copied.
template <typename T>
void times_channel_columns(const Problem& p, const Block& blk, float alpha, const T* a, const ChannelColumns& columns,
                           int thread, T* out, int64_t ld) {
  T* const rows = columns.rows.data_ptr<T>();
  if (columns.width == p.d) {
    gemm('N', 'N', blk.rows, p.d, p.keys, alpha, a, p.keys, blk.keys_of(rows, p), ld, 0.f, out, ld);
    return;
  }
  const T* b = rows + (blk.b * p.heads + blk.h) * p.keys * columns.width;  // the padded copy is heads-first
  T* scratch = columns.scratch_of<T>(thread);
  gemm('N', 'N', blk.rows, columns.width, p.keys, alpha, a, p.keys, b, columns.width, 0.f, scratch, columns.width);
  for (int64_t r = 0; r < blk.rows; ++r) std::copy_n(scratch + r * columns.width, p.d, out + r * ld);
}

// One block: its probabilities softmax(q kᵀ · scale) into `probs` [rows, keys] (the scores in `scores` on the way),
// their rows' statistics into `stats` (or not, if null), then its output rows, the probabilities times v, into `out`.
template <typename T>
void forward_block(const Problem& p, const Block& blk, const T* q, const T* k, const ChannelColumns& v, float* scores,
                   T* probs, RowStats* stats, int thread, T* out) {
  block_scores(p, blk, q, k, scores);
  softmax_rows(p, scores, probs, blk.rows, stats);
  times_channel_columns(p, blk, 1.f, probs, v, thread, blk.queries_of(out, p), p.row_stride());
}

// The layout the products read q, k, v and d_out in, from the model's [B, L, heads*d]. oneDNN's bf16 products take
// their fast (brgemm) kernels only on dense operands: reading a head's rows at the stride of all heads they fall back
// to a slower gemm, so bf16 copies each head's rows together, [B*heads, L, d] (bench_attention, bf16: SD-1.5's
// self-attention at 32x32 and 64x64 and SD-2's at 64x64 10-30% faster forward + backward, at 16x16 5% slower).
// oneDNN's sgemm packs its operands whatever their stride, and float32 takes them as they are (the copies made its
// 16x16 case 6-13% slower and the others no faster).
at::Tensor kernel_layout(const at::Tensor& x, int64_t heads) {
  // (head_to_batch_dim gives a view rather than a copy where B is 1: the kernel reads its rows contiguous.)
  return (x.scalar_type() == at::kBFloat16 ? head_to_batch_dim(x, heads) : x).contiguous();
}

// kernel_layout's inverse: back to [B, L, heads*d].
at::Tensor model_layout(const at::Tensor& x, int64_t heads) {
  return x.scalar_type() == at::kBFloat16 ? batch_to_head_dim(x, heads) : x;
}

// What forward keeps for backward besides q, k and v.
enum class Kept {
  kProbabilities,  // every block's probabilities [batch*heads, queries, keys], in the inputs' dtype
  kRowStats,       // each query row's RowStats: backward recomputes the probabilities
  kNothing,        // no backward will run
};

class WideHeadAttention : public torch::autograd::Function<WideHeadAttention> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                            const at::Tensor& v_in, int64_t heads, double scale, bool round_scores, int64_t kept_code) {
    RECORD_USER_SCOPE_WITH_INPUTS("sdtrain::attention", std::vector<c10::IValue>({q_in, k_in, v_in}));
    const Kept kept = static_cast<Kept>(kept_code);
    const Problem p = problem_of(q_in, k_in.size(1), heads, scale, round_scores);
    const at::Tensor q = kernel_layout(q_in, heads), k = kernel_layout(k_in, heads), v = kernel_layout(v_in, heads);
    at::Tensor out = at::empty(q.sizes(), q.options());
    at::Tensor probs =
        kept == Kept::kProbabilities ? at::empty({p.batch * heads, p.queries, p.keys}, q.options()) : at::Tensor();
    at::Tensor stats = kept == Kept::kRowStats
                           ? at::empty({p.batch * heads, p.queries, 2}, q.options().dtype(at::kFloat))
                           : at::Tensor();
    const ChannelColumns v_columns = ChannelColumns::of(v, p);
    with_element_type(q.scalar_type(), [&](auto zero) {
      using T = decltype(zero);
      const Workspace<T> workspace(p, q.options(), Workspace<T>::kForward);
      for_each_block(p, [&](const Block& blk, int thread) {
        BlockBuffers<T> buffers = workspace.of(thread);
        // Kept probabilities are written in place (float32 scores too, the softmax working over them).
        if (probs.defined()) {
          buffers.probs = blk.probabilities_of(probs.data_ptr<T>(), p);
          if constexpr (std::is_same_v<T, float>) buffers.scores = buffers.probs;
        }
        RowStats* block_stats = stats.defined() ? blk.row_stats_of(stats.data_ptr<float>(), p) : nullptr;
        forward_block(p, blk, q.data_ptr<T>(), k.data_ptr<T>(), v_columns, buffers.scores, buffers.probs, block_stats,
                      thread, out.data_ptr<T>());
      });
    });
    if (kept != Kept::kNothing) {
      ctx->save_for_backward({q, k, v, kept == Kept::kProbabilities ? probs : stats});
      ctx->saved_data["heads"] = heads;
      ctx->saved_data["scale"] = scale;
      ctx->saved_data["round_scores"] = round_scores;
      ctx->saved_data["kept"] = kept_code;
    }
    return model_layout(out, heads);
  }

  // With P = softmax(S), S = q kᵀ · scale, out = P v and dP = d_out vᵀ:
  //   dv = Pᵀ d_out,  dS = P ∘ (dP − rowsum(P ∘ dP)),  dq = dS k · scale,  dk = dSᵀ q · scale.
  // dk and dv sum over every query block: each thread accumulates its own float32 copy, summed in thread order at
  // the end, so the result does not depend on timing. bf16 keeps float32 until it writes a gradient, except for the
  // operands of the products (P and dS), which are bf16.
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2];
    const bool recompute = static_cast<Kept>(ctx->saved_data["kept"].toInt()) == Kept::kRowStats;
    RECORD_USER_SCOPE_WITH_INPUTS("sdtrain::attention_backward", std::vector<c10::IValue>({q, k, v}));
    const at::Tensor d_out_model = grad_outputs[0];
    const Problem p = problem_of(d_out_model, k.size(1), ctx->saved_data["heads"].toInt(),
                                 ctx->saved_data["scale"].toDouble(), ctx->saved_data["round_scores"].toBool());
    const at::Tensor d_out = kernel_layout(d_out_model, p.heads);
    const int64_t threads = at::get_num_threads(), ld = p.row_stride();
    at::Tensor dq = at::empty(q.sizes(), q.options());
    const auto float_options = k.options().dtype(at::kFloat);
    std::vector<int64_t> parts_shape = k.sizes().vec();  // each thread's float32 dk and dv, in k's layout
    parts_shape.insert(parts_shape.begin(), threads);
    at::Tensor dk_parts = at::zeros(parts_shape, float_options), dv_parts = at::zeros(parts_shape, float_options);
    const ChannelColumns k_columns = ChannelColumns::of(k, p);
    with_element_type(q.scalar_type(), [&](auto zero) {
      using T = decltype(zero);
      const Workspace<T> workspace(p, q.options(), Workspace<T>::kBackward);
      for_each_block(p, [&](const Block& blk, int thread) {
        BlockBuffers<T> buffers = workspace.of(thread);
        const T* block_d_out = blk.queries_of(d_out.data_ptr<T>(), p);
        const T* block_q = blk.queries_of(q.data_ptr<T>(), p);
        if (recompute) {  // forward's scores and softmax again, to the bit
          block_scores(p, blk, q.data_ptr<T>(), k.data_ptr<T>(), buffers.scores);
          probabilities_rows(p, buffers.scores, buffers.probs, blk.row_stats_of(saved[3].data_ptr<float>(), p),
                             blk.rows);
        } else {
          buffers.probs = blk.probabilities_of(saved[3].data_ptr<T>(), p);
        }
        const int64_t thread_part = thread * k.numel();
        float* dk = blk.keys_of(dk_parts.data_ptr<float>() + thread_part, p);
        float* dv = blk.keys_of(dv_parts.data_ptr<float>() + thread_part, p);
        gemm('N', 'T', blk.rows, p.keys, p.d, 1.f, block_d_out, ld, blk.keys_of(v.data_ptr<T>(), p), ld, 0.f,
             buffers.d_probs, p.keys);
        gemm('T', 'N', p.keys, p.d, blk.rows, 1.f, buffers.probs, p.keys, block_d_out, ld, 1.f, dv, ld);
        softmax_backward_rows(p, buffers.d_probs, buffers.probs, buffers.d_scores, blk.rows);
        times_channel_columns(p, blk, p.scale, buffers.d_scores, k_columns, thread, blk.queries_of(dq.data_ptr<T>(), p),
                              ld);
        gemm('T', 'N', p.keys, p.d, blk.rows, p.scale, buffers.d_scores, p.keys, block_q, ld, 1.f, dk, ld);
      });
    });
    return {model_layout(dq, p.heads),
            model_layout(dk_parts.sum(0).to(k.scalar_type()), p.heads),
            model_layout(dv_parts.sum(0).to(v.scalar_type()), p.heads),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }

 private:
  // From q's (or d_out's) model layout [B, Lq, heads*d] and the number of keys.
  static Problem problem_of(const at::Tensor& q, int64_t keys, int64_t heads, double scale, bool round_scores) {
    return {q.size(0),
            heads,
            q.size(1),
            keys,
            q.size(2) / heads,
            block_rows(q.size(1), keys),
            static_cast<float>(scale),
            round_scores && q.scalar_type() == at::kBFloat16,
            q.scalar_type() == at::kBFloat16};
  }
};

}  // namespace

bool wide_head_attention_fits(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads) {
  const at::ScalarType dtype = q.scalar_type();
  const auto is_input = [&](const at::Tensor& x) { return x.dim() == 3 && x.scalar_type() == dtype && x.is_cpu(); };
  // bf16 products are oneDNN's, as at::bmm's are where the CPU runs bf16 in oneDNN.
  const bool supported_dtype = dtype == at::kFloat || (dtype == at::kBFloat16 && sd::cpu_runs_bf16_in_onednn());
  return sd::cpu_has_avx2_fma() && supported_dtype && is_input(q) && is_input(k) && is_input(v) && heads > 0 &&
         q.size(2) % heads == 0 && q.size(2) / heads > 16 && k.size(2) == q.size(2) && v.sizes() == k.sizes() &&
         k.size(0) == q.size(0) && q.size(1) > 0 && k.size(1) > 0;
}

bool wide_head_attention_worth_keeping_probabilities(const at::Tensor& q, const at::Tensor& k, int64_t heads) {
  constexpr int64_t kMostKeptBytes = int64_t{64} << 20;
  return q.size(0) * heads * q.size(1) * k.size(1) * static_cast<int64_t>(q.element_size()) <= kMostKeptBytes;
}

at::Tensor wide_head_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                               double scale, bool upcast_attention, bool keep_probabilities) {
  SD_CHECK(wide_head_attention_fits(q, k, v, heads),
           "wide_head_attention: expected float32 (or, on a CPU that runs bf16 in oneDNN, bf16) q [B, Lq, heads*d], k "
           "and v [B, Lk, heads*d] of one dtype with {} heads of more than 16 channels on a CPU with AVX2 and FMA, "
           "got {} [{}], {} [{}], {} [{}]",
           heads, c10::toString(q.scalar_type()), fmt::join(q.sizes(), ", "), c10::toString(k.scalar_type()),
           fmt::join(k.sizes(), ", "), c10::toString(v.scalar_type()), fmt::join(v.sizes(), ", "));
  // Something is kept only for a backward that will run.
  const bool backward = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  const Kept kept = !backward ? Kept::kNothing : keep_probabilities ? Kept::kProbabilities : Kept::kRowStats;
  return WideHeadAttention::apply(q, k, v, heads, scale, !upcast_attention, static_cast<int64_t>(kept));
}

}  // namespace sd::models
