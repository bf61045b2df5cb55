#include "models/wide_head_attention.h"

#include <oneapi/dnnl/dnnl.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/simd.h"
#include "models/attention_tiles.h"
#include "perf/op_profiler.h"

namespace sd::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Row-major C = alpha · op(A) op(B) + beta · C, single-threaded inside the blocks' parallel loop.
void gemm(char trans_a, char trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const dnnl_status_t status = dnnl_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  // The shapes come from tensors checked in wide_head_attention: a failure here is a bug, not bad input.
  SD_CHECK(status == dnnl_success, "wide_head_attention: oneDNN sgemm failed with status {}", static_cast<int>(status));
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

// The shapes of one call: q [batch, queries, heads*d], k and v [batch, keys, heads*d].
struct Problem {
  int64_t batch, heads, queries, keys, d;
  int64_t block_rows;  // query rows per block
  float scale;

  int64_t row_stride() const { return heads * d; }
};

// Query rows [row, row + rows) of head h of batch entry b.
struct Block {
  int64_t b, h, row, rows;

  static Block of(const Problem& p, const Tile& t) { return {t.bh / p.heads, t.bh % p.heads, t.row, t.rows}; }
  // The block's first element in a [batch, rows_per_entry, heads*d] tensor.
  template <typename T>
  T* rows_of(T* data, const Problem& p, int64_t rows_per_entry, int64_t first_row) const {
    return data + ((b * rows_per_entry + first_row) * p.heads + h) * p.d;
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
  float* probabilities_of(float* data, const Problem& p) const {
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

void softmax_rows(float* x, int64_t rows, int64_t n, RowStats* stats) {
  (sd::kernel_vector_bits() == 512 ? avx512::softmax_rows : avx2::softmax_rows)(x, rows, n, stats);
}

void probabilities_rows(float* x, const RowStats* stats, int64_t rows, int64_t n) {
  (sd::kernel_vector_bits() == 512 ? avx512::probabilities_rows : avx2::probabilities_rows)(x, stats, rows, n);
}

void softmax_backward_rows(float* dp, const float* p, int64_t rows, int64_t n) {
  (sd::kernel_vector_bits() == 512 ? avx512::softmax_backward_rows : avx2::softmax_backward_rows)(dp, p, rows, n);
}

// A block's scores q kᵀ · scale into `scores` [rows, keys].
void block_scores(const Problem& p, const Block& blk, const float* q, const float* k, float* scores) {
  const int64_t ld = p.row_stride();
  gemm('N', 'T', blk.rows, p.keys, p.d, p.scale, blk.queries_of(q, p), ld, blk.keys_of(k, p), ld, 0.f, scores, p.keys);
}

// One block: its probabilities softmax(q kᵀ · scale) into `probs` [rows, keys] (the softmax in place over the
// scores), their rows' statistics into `stats` (or not, if null), then its output rows, the probabilities times v,
// into `out`.
void forward_block(const Problem& p, const Block& blk, const float* q, const float* k, const float* v, float* probs,
                   RowStats* stats, float* out) {
  const int64_t ld = p.row_stride();
  block_scores(p, blk, q, k, probs);
  softmax_rows(probs, blk.rows, p.keys, stats);
  gemm('N', 'N', blk.rows, p.d, p.keys, 1.f, probs, p.keys, blk.keys_of(v, p), ld, 0.f, blk.queries_of(out, p), ld);
}

// What forward keeps for backward besides q, k and v.
enum class Kept {
  kProbabilities,  // every block's probabilities [batch*heads, queries, keys]
  kRowStats,       // each query row's RowStats: backward recomputes the probabilities
  kNothing,        // no backward will run
};

class WideHeadAttention : public torch::autograd::Function<WideHeadAttention> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                            const at::Tensor& v_in, int64_t heads, double scale, int64_t kept_code) {
    RECORD_USER_SCOPE_WITH_INPUTS("sdtrain::attention", std::vector<c10::IValue>({q_in, k_in, v_in}));
    const Kept kept = static_cast<Kept>(kept_code);
    const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
    const Problem p = problem_of(q, k, heads, scale);
    at::Tensor out = at::empty(q.sizes(), q.options());
    // Kept probabilities are written in place; otherwise each thread reuses one block buffer.
    at::Tensor probs = kept == Kept::kProbabilities ? at::empty({p.batch * heads, p.queries, p.keys}, q.options())
                                                    : block_buffers(p, q.options());
    at::Tensor stats = kept == Kept::kRowStats ? at::empty({p.batch * heads, p.queries, 2}, q.options()) : at::Tensor();
    for_each_block(p, [&](const Block& blk, int thread) {
      float* block_probs = kept == Kept::kProbabilities ? blk.probabilities_of(probs.data_ptr<float>(), p)
                                                        : probs.data_ptr<float>() + thread * p.block_rows * p.keys;
      RowStats* block_stats = stats.defined() ? blk.row_stats_of(stats.data_ptr<float>(), p) : nullptr;
      forward_block(p, blk, q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), block_probs, block_stats,
                    out.data_ptr<float>());
    });
    if (kept != Kept::kNothing) {
      ctx->save_for_backward({q, k, v, kept == Kept::kProbabilities ? probs : stats});
      ctx->saved_data["heads"] = heads;
      ctx->saved_data["scale"] = scale;
      ctx->saved_data["kept"] = kept_code;
    }
    return out;
  }

  // With P = softmax(S), S = q kᵀ · scale, out = P v and dP = d_out vᵀ:
  //   dv = Pᵀ d_out,  dS = P ∘ (dP − rowsum(P ∘ dP)),  dq = dS k · scale,  dk = dSᵀ q · scale.
  // dk and dv sum over every query block: each thread accumulates its own copy, summed in thread order at the end,
  // so the result does not depend on timing.
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2];
    const bool recompute = static_cast<Kept>(ctx->saved_data["kept"].toInt()) == Kept::kRowStats;
    RECORD_USER_SCOPE_WITH_INPUTS("sdtrain::attention_backward", std::vector<c10::IValue>({q, k, v}));
    const Problem p = problem_of(q, k, ctx->saved_data["heads"].toInt(), ctx->saved_data["scale"].toDouble());
    const at::Tensor d_out = grad_outputs[0].contiguous();
    const int64_t threads = at::get_num_threads(), ld = p.row_stride();
    at::Tensor dq = at::empty(q.sizes(), q.options());
    at::Tensor dk_parts = at::zeros({threads, p.batch, p.keys, ld}, k.options());
    at::Tensor dv_parts = at::zeros({threads, p.batch, p.keys, ld}, v.options());
    at::Tensor d_probs = block_buffers(p, q.options());
    const at::Tensor probs = recompute ? block_buffers(p, q.options()) : saved[3];
    for_each_block(p, [&](const Block& blk, int thread) {
      const float* block_d_out = blk.queries_of(d_out.data_ptr<float>(), p);
      const float* block_q = blk.queries_of(q.data_ptr<float>(), p);
      float* block_probs = recompute ? probs.data_ptr<float>() + thread * p.block_rows * p.keys
                                     : blk.probabilities_of(probs.data_ptr<float>(), p);
      if (recompute) {  // forward's scores and softmax again, to the bit
        block_scores(p, blk, q.data_ptr<float>(), k.data_ptr<float>(), block_probs);
        probabilities_rows(block_probs, blk.row_stats_of(saved[3].data_ptr<float>(), p), blk.rows, p.keys);
      }
      float* block_d_probs = d_probs.data_ptr<float>() + thread * p.block_rows * p.keys;
      float* dk = blk.keys_of(dk_parts.data_ptr<float>() + thread * p.batch * p.keys * ld, p);
      float* dv = blk.keys_of(dv_parts.data_ptr<float>() + thread * p.batch * p.keys * ld, p);
      gemm('N', 'T', blk.rows, p.keys, p.d, 1.f, block_d_out, ld, blk.keys_of(v.data_ptr<float>(), p), ld, 0.f,
           block_d_probs, p.keys);
      gemm('T', 'N', p.keys, p.d, blk.rows, 1.f, block_probs, p.keys, block_d_out, ld, 1.f, dv, ld);
      // softmax's backward, written over dP: dS = P ∘ (dP − rowsum(P ∘ dP)).
      softmax_backward_rows(block_d_probs, block_probs, blk.rows, p.keys);
      gemm('N', 'N', blk.rows, p.d, p.keys, p.scale, block_d_probs, p.keys, blk.keys_of(k.data_ptr<float>(), p), ld,
           0.f, blk.queries_of(dq.data_ptr<float>(), p), ld);
      gemm('T', 'N', p.keys, p.d, blk.rows, p.scale, block_d_probs, p.keys, block_q, ld, 1.f, dk, ld);
    });
    return {dq, dk_parts.sum(0), dv_parts.sum(0), at::Tensor(), at::Tensor(), at::Tensor()};
  }

 private:
  // One [block_rows, keys] buffer per thread.
  static at::Tensor block_buffers(const Problem& p, const at::TensorOptions& options) {
    return at::empty({at::get_num_threads(), p.block_rows, p.keys}, options);
  }

  static Problem problem_of(const at::Tensor& q, const at::Tensor& k, int64_t heads, double scale) {
    const int64_t d = q.size(2) / heads;
    return {q.size(0), heads, q.size(1), k.size(1), d, block_rows(q.size(1), k.size(1)), static_cast<float>(scale)};
  }
};

}  // namespace

bool wide_head_attention_fits(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads) {
  const auto is_input = [](const at::Tensor& x) { return x.dim() == 3 && x.scalar_type() == at::kFloat && x.is_cpu(); };
  return sd::cpu_has_avx2_fma() && is_input(q) && is_input(k) && is_input(v) && heads > 0 && q.size(2) % heads == 0 &&
         q.size(2) / heads > 16 && k.size(2) == q.size(2) && v.sizes() == k.sizes() && k.size(0) == q.size(0) &&
         q.size(1) > 0 && k.size(1) > 0;
}

bool wide_head_attention_worth_keeping_probabilities(const at::Tensor& q, const at::Tensor& k, int64_t heads) {
  constexpr int64_t kMostKeptBytes = int64_t{64} << 20;
  return q.size(0) * heads * q.size(1) * k.size(1) * static_cast<int64_t>(sizeof(float)) <= kMostKeptBytes;
}

at::Tensor wide_head_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                               double scale, bool keep_probabilities) {
  SD_CHECK(wide_head_attention_fits(q, k, v, heads),
           "wide_head_attention: expected float32 q [B, Lq, heads*d], k and v [B, Lk, heads*d] with {} heads of more "
           "than 16 channels on a CPU with AVX2 and FMA, got [{}], [{}], [{}]",
           heads, fmt::join(q.sizes(), ", "), fmt::join(k.sizes(), ", "), fmt::join(v.sizes(), ", "));
  // Something is kept only for a backward that will run.
  const bool backward = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  const Kept kept = !backward ? Kept::kNothing : keep_probabilities ? Kept::kProbabilities : Kept::kRowStats;
  return WideHeadAttention::apply(q, k, v, heads, scale, static_cast<int64_t>(kept));
}

}  // namespace sd::models
