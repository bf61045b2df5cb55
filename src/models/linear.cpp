#include "models/linear.h"

#include <torch/autograd.h>

#include "core/onednn_matmul.h"

namespace sd::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The gradients are those of at::linear's addmm: dx = dy·W, dW = dyᵀ·x, db = Σ_rows dy, each computed only when
// its input takes a gradient (a frozen layer under textual inversion computes dx alone).
struct OnednnLinear : torch::autograd::Function<OnednnLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows, const at::Tensor& weight,
                            const c10::optional<at::Tensor>& bias) {
    ctx->save_for_backward({rows, weight});
    ctx->saved_data["has_bias"] = bias.has_value();
    return onednn_linear(rows, weight, bias.value_or(at::Tensor()));
  }

  static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &rows = saved[0], &weight = saved[1], &dy = grads[0];
    at::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) dx = sd::mm(dy, weight);
    if (ctx->needs_input_grad(1)) dw = sd::mm(dy.t(), rows);
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) db = dy.sum(0);
    return {dx, dw, db};
  }
};

}  // namespace

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  // at::linear adds the bias inside the product (one rounding) for a matrix or a contiguous 3-D input; for any
  // other input it multiplies, then adds (two roundings). Those stay with at::linear, to round as it does.
  const bool one_rounding = x.dim() == 2 || (x.dim() >= 3 && (!bias.defined() || (x.dim() == 3 && x.is_contiguous())));
  if (weight.dim() == 2 && one_rounding &&
      (!bias.defined() || (bias.scalar_type() == at::kBFloat16 && bias.numel() == weight.size(0)))) {
    const at::Tensor rows = x.dim() == 2 ? x : x.reshape({-1, x.size(-1)});  // a view, unless x's layout needs a copy
    if (onednn_linear_fits(rows, weight)) {
      std::vector<int64_t> sizes = x.sizes().vec();
      sizes.back() = weight.size(0);
      const auto optional_bias = bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt;
      return OnednnLinear::apply(rows, weight, optional_bias).view(sizes);
    }
  }
  return at::linear(x, weight, bias);
}

}  // namespace sd::models
