#include "models/linear.h"

#include <torch/autograd.h>

#include "core/cpu_features.h"
#include "core/onednn_matmul.h"
#include "core/onednn_sgemm.h"

namespace sd::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// How a linear layer's forward multiplies; its backward is the same either way.
enum class Forward : int64_t {
  kOnednn,                // bf16: a kept oneDNN primitive (core/onednn_matmul.h)
  kWeightTimesRowsThenT,  // float32: yᵀ = W·xᵀ + b, then transposed (see transposed_product_is_faster)
  kRowsTimesWeightT,      // float32: y = x·Wᵀ + b, at::linear's own product
};

// The gradients are those of at::linear's addmm: dx = dy·W, dW = dyᵀ·x, db = Σ_rows dy, each computed only when
// its input takes a gradient (a frozen layer under textual inversion computes dx alone). The node takes x with its
// leading dimensions and flattens them to rows inside: flattening outside recorded two autograd view nodes per layer
// (a reshape and a view back), ~270 a tiny-sd1 textual-inversion step, whose time is LibTorch's per-op cost.
struct LinearRows : torch::autograd::Function<LinearRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const c10::optional<at::Tensor>& bias, int64_t how) {
    const at::Tensor rows = as_rows(x);  // a view, unless x's layout needs a copy
    ctx->save_for_backward({rows, weight});
    ctx->saved_data["has_bias"] = bias.has_value();
    return rows_product(rows, weight, bias, static_cast<Forward>(how)).view(with_last(x.sizes(), weight.size(0)));
  }

  static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &rows = saved[0], &weight = saved[1];
    const at::Tensor dy = as_rows(grads[0]);
    at::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) dx = sd::mm(dy, weight).view(with_last(grads[0].sizes(), weight.size(1)));
    if (ctx->needs_input_grad(1)) dw = sd::mm(dy.t(), rows);
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) db = dy.sum(0);
    return {dx, dw, db, at::Tensor()};
  }

 private:
  static at::Tensor as_rows(const at::Tensor& t) { return t.dim() == 2 ? t : t.reshape({-1, t.size(-1)}); }

  static std::vector<int64_t> with_last(at::IntArrayRef sizes, int64_t last) {
    std::vector<int64_t> out = sizes.vec();
    out.back() = last;
    return out;
  }

  static at::Tensor rows_product(const at::Tensor& rows, const at::Tensor& weight,
                                 const c10::optional<at::Tensor>& bias, Forward how) {
    if (how == Forward::kOnednn) return onednn_linear(rows, weight, bias.value_or(at::Tensor()));
    if (how == Forward::kRowsTimesWeightT) {
      const at::Tensor b = bias.value_or(at::Tensor());
      if (float32_linear_fits(rows, weight, b)) return float32_linear(rows, weight, b);
      return bias.has_value() ? at::addmm(*bias, rows, weight.t()) : at::mm(rows, weight.t());
    }
    const at::Tensor transposed =
        bias.has_value() ? at::addmm(bias->unsqueeze(1), weight, rows.t()) : at::mm(weight, rows.t());
    return transposed.t().contiguous();
  }
};

// at::linear adds the bias inside the product (one rounding) for a matrix or a contiguous 3-D input; for any other
// input it multiplies, then adds (two roundings). Those stay with at::linear, to round as it does.
bool bias_added_in_the_product(const at::Tensor& x, const at::Tensor& bias) {
  return x.dim() == 2 || (x.dim() >= 3 && (!bias.defined() || (x.dim() == 3 && x.is_contiguous())));
}

bool float32_cpu(const at::Tensor& t) { return !t.defined() || (t.scalar_type() == at::kFloat && t.is_cpu()); }

}  // namespace

bool transposed_product_is_faster(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  // oneDNN's AVX-512 sgemm multiplies x·Wᵀ (its right operand transposed) at 60-90% of the rate it multiplies
  // W·xᵀ (with the copy that transposes the narrow result) when x has 16-80 rows and W is large: it packs the
  // transposed weight slowly, and a narrow product is mostly that packing (docs/benchmarks.md, twenty-ninth sitting).
  // SD-1.5's transformers at 8x8 (256² images: 64 tokens) and CLIP's feed-forward layers (77 tokens) are such products.
  // The rule looks at the tokens of one sample, not at the batch's rows, so that a sample's output does not depend on
  // the batch it is in; at AVX2's kernels the two forms run alike. Small weights (under 4 MiB) gain nothing.
  constexpr int64_t kMinTokens = 16, kMaxTokens = 80, kMinWeightElements = int64_t{1} << 20;
  return cpu_runs_avx512_sgemm() && x.dim() == 3 && float32_cpu(x) && float32_cpu(weight) && float32_cpu(bias) &&
         weight.dim() == 2 && weight.numel() >= kMinWeightElements && x.size(1) >= kMinTokens &&
         x.size(1) <= kMaxTokens && bias_added_in_the_product(x, bias);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (weight.dim() != 2 || !bias_added_in_the_product(x, bias) || (bias.defined() && bias.numel() != weight.size(0)))
    return at::linear(x, weight, bias);
  // Judged on x as the node will flatten it, through a view that records no autograd history.
  const at::Tensor rows = x.dim() == 2 ? x : x.detach().reshape({-1, x.size(-1)});
  Forward how;
  if (onednn_linear_fits(rows, weight) && (!bias.defined() || bias.scalar_type() == at::kBFloat16))
    how = Forward::kOnednn;
  else if (transposed_product_is_faster(x, weight, bias))
    how = Forward::kWeightTimesRowsThenT;
  else if (float32_cpu(x) && float32_cpu(weight) && float32_cpu(bias))
    how = Forward::kRowsTimesWeightT;
  else
    return at::linear(x, weight, bias);
  const auto optional_bias = bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt;
  return LinearRows::apply(x, weight, optional_bias, static_cast<int64_t>(how));
}

}  // namespace sd::models
