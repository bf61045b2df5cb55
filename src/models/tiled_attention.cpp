#include "models/tiled_attention.h"

#include <torch/csrc/autograd/custom_function.h>

#include "core/error.h"
#include "models/attention_tiles.h"
#include "perf/op_profiler.h"

namespace sd::models {

// 128 KiB to 4 MiB of scores per tile measured alike (bench_attention); 16 to 512 rows.
int64_t attention_tile_rows(int64_t lq, int64_t lk) { return tile_rows_for(lq, lk, 16, 512); }

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Softmax and accumulations run in float32, or float64 for float64 inputs.
at::ScalarType math_dtype(const at::Tensor& x) { return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

// The probabilities of one tile in math_dtype: softmax(q_rows kᵀ · scale) over the keys.
// (Scaling the few query rows costs less than scaling the many scores.)
at::Tensor tile_probabilities(const at::Tensor& q_rows, const at::Tensor& k, double scale) {
  const at::Tensor scores = at::mm(q_rows * scale, k.t());
  return at::softmax(scores, -1, math_dtype(scores));
}

// acc += alpha · a b, without a temporary when a and b have acc's dtype.
void add_product(at::Tensor acc, const at::Tensor& a, const at::Tensor& b, double alpha) {
  if (a.scalar_type() == acc.scalar_type() && b.scalar_type() == acc.scalar_type())
    acc.addmm_(a, b, /*beta=*/1, alpha);
  else
    acc.add_(at::mm(a, b), alpha);
}

class TiledAttention : public torch::autograd::Function<TiledAttention> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scale, bool upcast_attention, int64_t tile_rows) {
    RECORD_USER_SCOPE_WITH_INPUTS("sdtrain::attention", std::vector<c10::IValue>({q, k, v}));
    ctx->save_for_backward({q, k, v});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["upcast"] = upcast_attention;
    ctx->saved_data["tile_rows"] = tile_rows;
    const at::Tensor qs = score_operand(q, upcast_attention), ks = score_operand(k, upcast_attention);
    at::Tensor out = at::empty({q.size(0), q.size(1), v.size(2)}, v.options());
    for_each_tile(q.size(0), q.size(1), tile_rows, [&](const Tile& t, int) {
      const at::Tensor probs = tile_probabilities(qs[t.bh].narrow(0, t.row, t.rows), ks[t.bh], scale);
      at::Tensor out_rows = out[t.bh].narrow(0, t.row, t.rows);
      at::mm_out(out_rows, probs.to(v.scalar_type()), v[t.bh]);
    });
    return out;
  }

  // With P = softmax(S), S = q kᵀ · scale, out = P v and dP = d_out vᵀ:
  //   dv = Pᵀ d_out,  dS = P ∘ (dP − rowsum(P ∘ dP)),  dq = dS k · scale,  dk = dSᵀ q · scale.
  // dk and dv sum over every query tile: each thread accumulates its own float32 (float64) copy, summed in thread order
  // at the end, so the result does not depend on timing.
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2];
    RECORD_USER_SCOPE_WITH_INPUTS("sdtrain::attention_backward", std::vector<c10::IValue>({q, k, v}));
    const double scale = ctx->saved_data["scale"].toDouble();
    const bool upcast = ctx->saved_data["upcast"].toBool();
    const at::Tensor d_out = grad_outputs[0].contiguous();
    const at::Tensor qs = score_operand(q, upcast), ks = score_operand(k, upcast);
    at::Tensor dq = at::empty(qs.sizes(), qs.options());
    const int64_t threads = at::get_num_threads();
    at::Tensor dk_parts = at::zeros({threads, k.size(0), k.size(1), k.size(2)}, math_dtype(k));
    at::Tensor dv_parts = at::zeros({threads, v.size(0), v.size(1), v.size(2)}, math_dtype(v));
    const int64_t tile_rows = ctx->saved_data["tile_rows"].toInt();
    for_each_tile(q.size(0), q.size(1), tile_rows, [&](const Tile& t, int thread) {
      const at::Tensor q_rows = qs[t.bh].narrow(0, t.row, t.rows), d_out_rows = d_out[t.bh].narrow(0, t.row, t.rows);
      const at::Tensor probs = tile_probabilities(q_rows, ks[t.bh], scale);
      const at::Tensor d_probs = at::mm(d_out_rows, v[t.bh].t()).to(probs.scalar_type());
      // softmax's own backward kernel: P ∘ (dP − rowsum(P ∘ dP)) in one pass.
      const at::Tensor d_scores = at::_softmax_backward_data(d_probs, probs, -1, probs.scalar_type());
      const at::Tensor d_scores_op = d_scores.to(qs.scalar_type());
      at::Tensor dq_rows = dq[t.bh].narrow(0, t.row, t.rows);
      at::mm_out(dq_rows, d_scores_op, ks[t.bh]);
      dq_rows.mul_(scale);
      add_product(dk_parts[thread][t.bh], d_scores_op.t(), q_rows, scale);
      add_product(dv_parts[thread][t.bh], probs.to(v.scalar_type()).t(), d_out_rows, 1.0);
    });
    return {dq.to(q.scalar_type()),
            dk_parts.sum(0).to(k.scalar_type()),
            dv_parts.sum(0).to(v.scalar_type()),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }

 private:
  static at::Tensor score_operand(const at::Tensor& x, bool upcast) {
    return (upcast ? x.to(at::kFloat) : x).contiguous();
  }
};

}  // namespace

at::Tensor tiled_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                           bool upcast_attention, int64_t tile_rows) {
  SD_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && k.size(0) == q.size(0) && v.size(0) == q.size(0) &&
               k.size(2) == q.size(2) && v.size(1) == k.size(1),
           "tiled_attention: expected q [BH, Lq, d], k [BH, Lk, d], v [BH, Lk, dv], got [{}], [{}], [{}]",
           fmt::join(q.sizes(), ", "), fmt::join(k.sizes(), ", "), fmt::join(v.sizes(), ", "));
  if (tile_rows <= 0) tile_rows = attention_tile_rows(q.size(1), k.size(1));
  return TiledAttention::apply(q, k, v, scale, upcast_attention, tile_rows);
}

}  // namespace sd::models
