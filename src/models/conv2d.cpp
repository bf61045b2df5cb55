#include "models/conv2d.h"

#include <torch/autograd.h>

#include "core/onednn_sgemm.h"
#include "models/im2col.h"

namespace sd::models {

namespace {

// Where the GEMM wins, measured with bench_conv (output pixels over the whole batch):
//   float32: up to 256 pixels (ahead at 8x8 and 16x16, behind at 32x32);
//   bf16: oneDNN's bf16 convolution is fast on large maps but slow on small ones (74-250 GFLOP/s at 4x4 and 8x8
//   against 360-440 for the GEMM), and its 1x1 convolutions trail the GEMM up to 32x32 (360 against 520), while
//   its 3x3 ones lead from 16x16 (514 against 412).
constexpr int64_t kMostGemmPixelsFloat32 = 256;
constexpr int64_t kMostGemmPixelsBf16Pointwise = 1024;
constexpr int64_t kMostGemmPixelsBf16 = 256, kMostGemmMapPixelsBf16 = 64;

int64_t output_size(int64_t in, int64_t kernel, int64_t stride, int64_t padding) {
  return (in + 2 * padding - kernel) / stride + 1;
}

// Whether autograd records a product of these operands.
bool recorded(const at::Tensor& w, const at::Tensor& x, const at::Tensor& bias) {
  return at::GradMode::is_enabled() &&
         (w.requires_grad() || x.requires_grad() || (bias.defined() && bias.requires_grad()));
}

// w·x + bias (bias [rows] or undefined). Where autograd records nothing (inference, or inside a Function's forward),
// bf16 runs in a oneDNN primitive kept per shape (core/onednn_matmul.h), with at::addmm's bits but without its
// per-call overhead, which dominates the many small GEMMs of tiny models (a single pixel stays with at::addmm, whose
// bits there depend on layouts).
at::Tensor affine(const at::Tensor& w, const at::Tensor& x, const at::Tensor& bias) {
  if (!recorded(w, x, bias) && x.size(1) > 1 && onednn_matmul_fits(w, x))
    return bias.defined() ? onednn_addmm(bias, w, x) : onednn_matmul(w, x);
  return bias.defined() ? at::addmm(bias.unsqueeze(1), w, x) : at::mm(w, x);
}

// [N, Cin·kh·kw, H'·W'] patch columns (or, for a 1x1 convolution, the input maps themselves) as one matrix
// [Cin·kh·kw, N·H'·W']: a copy only if N > 1.
at::Tensor columns_as_matrix(const at::Tensor& columns) {
  const at::Tensor per_sample = columns.flatten(2);
  return per_sample.transpose(0, 1).reshape({per_sample.size(1), per_sample.size(0) * per_sample.size(2)});
}

// The GEMM's [Cout, N·H'·W'] as the layer's output maps [N, Cout, H', W'].
at::Tensor as_maps(const at::Tensor& product, int64_t n, int64_t oh, int64_t ow) {
  return product.view({product.size(0), n, oh, ow}).transpose(0, 1).contiguous();
}

// The layer's output maps [N, Cout, H', W'] from its patch columns (as columns_as_matrix takes them), w and bias.
// Outside autograd, each image's product runs alone in oneDNN where it fits, reading its columns and writing its
// maps in place: one product over the batch needs columns_as_matrix's copy and as_maps' (for tiny models, their
// eight dispatched ops per layer outweighed the larger product).
at::Tensor convolve_columns(const at::Tensor& w, const at::Tensor& columns, const at::Tensor& bias, int64_t oh,
                            int64_t ow) {
  const at::Tensor per_sample = columns.flatten(2);
  if (!recorded(w, columns, bias) && onednn_per_sample_fits(w, per_sample))
    return onednn_addmm_per_sample(bias, w, per_sample).view({columns.size(0), w.size(0), oh, ow});
  if (!recorded(w, columns, bias) && float32_per_sample_fits(w, per_sample))
    return float32_addmm_per_sample(bias, w, per_sample).view({columns.size(0), w.size(0), oh, ow});
  return as_maps(affine(w, columns_as_matrix(columns), bias), columns.size(0), oh, ow);
}

// The convolution of patch columns (as columns_as_matrix takes them) by a frozen weight w [Cout, Cin·kh·kw] and bias:
// the backward computes only the columns' gradient, through the layer's FrozenWeight. Being outside autograd, the
// forward product runs in a kept oneDNN primitive. (Computed as its transpose, (xᵀ·wᵀ + bias)ᵀ, where oneDNN adds the
// bias itself, it ran 20-40% slower on SD-1.5's 4x4 and 8x8 maps and rounded differently there.) The node reshapes
// between columns, matrix and maps itself: done outside, they recorded six autograd nodes per layer (two transposes,
// two copies, two views), which with their backward ops made ~680 of tiny-sd1's ~9,700 ops a textual-inversion step.
// Both products run per image (convolve_columns, FrozenWeight::columns_gradient), which took the copies and their
// ops out too: 8,999 -> 7,102 ops a step (bf16); float32's per-image sgemm_ calls (core/onednn_sgemm.h), 8,099 ->
// 6,539.
struct FrozenGemm : torch::autograd::Function<FrozenGemm> {
  // (An undefined tensor cannot be a Function's input, so a layer without bias passes none.)
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& columns, const at::Tensor& w,
                            const c10::optional<at::Tensor>& bias, const c10::intrusive_ptr<FrozenWeight>& frozen,
                            int64_t oh, int64_t ow) {
    ctx->saved_data["w"] = w;
    ctx->saved_data["frozen"] = c10::IValue::make_capsule(frozen);
    ctx->saved_data["columns_sizes"] = columns.sizes();
    return convolve_columns(w, columns, bias.value_or(at::Tensor()), oh, ow);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 const torch::autograd::variable_list& grads) {
    const auto frozen = c10::static_intrusive_pointer_cast<FrozenWeight>(ctx->saved_data["frozen"].toCapsule());
    const at::Tensor& dy = grads[0];  // [N, Cout, H', W']
    const at::Tensor d_columns = frozen->columns_gradient(ctx->saved_data["w"].toTensor(), dy.flatten(2));
    return {d_columns.reshape(ctx->saved_data["columns_sizes"].toIntVector()),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

// affine() for maps of at most kMostPixelsTransposedInputGradient pixels, with the input's gradient taken as (dYᵀ·w)ᵀ
// rather than autograd's wᵀ·dY: for so few pixels wᵀ·dY is a GEMM with a transposed operand and a narrow output,
// which oneDNN ran at 97-160 GFLOP/s against 170-270 for dYᵀ·w on SD-1.5's 8x8 and 4x4 maps. bench_conv, float32,
// the gemm path against LibTorch's in the same run (before -> after, two runs), batch 1: 3x3 at 8x8 1.18 -> 1.47,
// 1.31; 3x3 at 4x4 1.32 -> 1.47, 1.44; 1x1 at 4x4 1.18 -> 1.54, 1.42; batch 4: 3x3 at 8x8 1.08 -> 0.94, 1.02; 3x3
// at 4x4 1.30 -> 1.68, 1.52. At 16x16 it gained nothing. The rule is per map, not per batch, so a batch's images
// take the path they take alone: the products then round alike whether ranks split the batch or one rank runs it
// (an input gradient rounded another way flips the sign of AdamW's first steps on near-zero gradients). float32
// only: bf16 products need a CPU with bf16 instructions to be measured (docs/benchmarks.md).
constexpr int64_t kMostPixelsTransposedInputGradient = 64;
struct TransposedInputGradientGemm : torch::autograd::Function<TransposedInputGradientGemm> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const c10::optional<at::Tensor>& bias) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["has_bias"] = bias.has_value();
    return affine(w, x, bias.value_or(at::Tensor()));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 const torch::autograd::variable_list& grads) {
    const at::Tensor& dy = grads[0];
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    return {ctx->needs_input_grad(0) ? at::mm(dy.t(), w).t() : at::Tensor(),
            ctx->needs_input_grad(1) ? at::mm(dy, x.t()) : at::Tensor(),
            ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2) ? dy.sum(1) : at::Tensor()};
  }
};

}  // namespace

at::Tensor FrozenWeight::columns_gradient(const at::Tensor& w, const at::Tensor& dy) {
  // Each image's (dY_sᵀ·w)ᵀ from the packed w, dY_sᵀ a view: one product over the batch's [Cout, N·H'·W'] needs a
  // copy into that matrix first.
  const at::Tensor dy_t = dy.transpose(1, 2);
  if (onednn_per_sample_fits(dy_t, w)) return packed_.times(dy_t, w).transpose(1, 2);
  if (!transposed_.defined() || !w.storage().is_alias_of(source_) || source_version_ != w._version()) {
    at::NoGradGuard no_grad;
    transposed_ = w.t().contiguous();
    source_ = w.storage();
    source_version_ = w._version();
  }
  if (float32_per_sample_fits(transposed_, dy)) return float32_addmm_per_sample(at::Tensor(), transposed_, dy);
  const int64_t n = dy.size(0), cout = dy.size(1);
  const at::Tensor d_matrix = sd::mm(transposed_, dy.transpose(0, 1).reshape({cout, -1}));  // [Cin·kh·kw, N·H'·W']
  return d_matrix.view({d_matrix.size(0), n, -1}).transpose(0, 1);
}

int64_t FrozenWeight::bytes() const {
  return packed_.bytes() + (transposed_.defined() ? static_cast<int64_t>(transposed_.nbytes()) : 0);
}

// One GEMM: [Cout, Cin·kh·kw] x [Cin·kh·kw, N·H'·W'].
at::Tensor conv2d_as_gemm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, at::IntArrayRef stride,
                          at::IntArrayRef padding, const c10::intrusive_ptr<FrozenWeight>& frozen) {
  const int64_t n = x.size(0), cout = weight.size(0), kh = weight.size(2), kw = weight.size(3);
  const int64_t oh = output_size(x.size(2), kh, stride[0], padding[0]),
                ow = output_size(x.size(3), kw, stride[1], padding[1]);
  const bool pointwise = kh == 1 && kw == 1 && stride[0] == 1 && stride[1] == 1 && padding[0] == 0 && padding[1] == 0;
  const at::Tensor columns =  // [N, Cin·kh·kw, H'·W'], or the maps themselves
      pointwise ? x : unfold_patches(x, {kh, kw}, padding, stride);
  const at::Tensor w = weight.reshape({cout, -1});
  const c10::optional<at::Tensor> maybe_bias = bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt;
  if (frozen) return FrozenGemm::apply(columns, w, maybe_bias, frozen, oh, ow);
  if (x.scalar_type() == at::kFloat && oh * ow <= kMostPixelsTransposedInputGradient)
    return as_maps(TransposedInputGradientGemm::apply(columns_as_matrix(columns), w, maybe_bias), n, oh, ow);
  return convolve_columns(w, columns, bias, oh, ow);
}

bool conv2d_runs_as_gemm(const at::Tensor& x, const at::Tensor& weight, at::IntArrayRef stride,
                         at::IntArrayRef padding) {
  if (!x.is_cpu() || x.dim() != 4 || weight.dim() != 4) return false;
  const int64_t map_pixels = output_size(x.size(2), weight.size(2), stride[0], padding[0]) *
                             output_size(x.size(3), weight.size(3), stride[1], padding[1]);
  const int64_t pixels = x.size(0) * map_pixels;
  if (x.scalar_type() == at::kFloat) return pixels <= kMostGemmPixelsFloat32;
  if (x.scalar_type() != at::kBFloat16) return false;
  if (weight.size(2) == 1 && weight.size(3) == 1) return pixels <= kMostGemmPixelsBf16Pointwise;
  return pixels <= kMostGemmPixelsBf16 && map_pixels <= kMostGemmMapPixelsBf16;
}

at::Tensor conv2d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, at::IntArrayRef stride,
                  at::IntArrayRef padding, const c10::intrusive_ptr<FrozenWeight>& frozen) {
  if (conv2d_runs_as_gemm(x, weight, stride, padding)) {
    const bool only_input_gradient = frozen && at::GradMode::is_enabled() && x.requires_grad() &&
                                     !weight.requires_grad() && !(bias.defined() && bias.requires_grad());
    return conv2d_as_gemm(x, weight, bias, stride, padding,
                          only_input_gradient ? frozen : c10::intrusive_ptr<FrozenWeight>());
  }
  return at::conv2d(x, weight, bias, stride, padding, /*dilation=*/{1, 1});
}

}  // namespace sd::models
