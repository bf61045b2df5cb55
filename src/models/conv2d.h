// How the models run a 2-D convolution. LibTorch 1.13 on CPU runs convolutions in oneDNN (a few shapes in its own
// im2col kernel), which in float32 reaches 120-150 GFLOP/s on SD's 32x32 and 64x64 feature maps but only 15-30
// GFLOP/s on the 8x8 and 4x4 maps of the lowest UNet levels, where a batch has few pixels and many channels. There,
// unfolding the input (im2col, models/im2col.h) and running one GEMM over every image and pixel is 2-4x faster, forward
// and backward (bench/bench_conv). In bf16 the same holds on 8x8 and 4x4 maps and, for 1x1 kernels, up to 32x32. Every
// other case, and every other dtype or device, takes LibTorch's own convolution.
#pragma once
#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include "core/onednn_matmul.h"

namespace sd::models {

// What a frozen convolution keeps of its weight for its input gradient, wᵀ·dY: training through frozen layers
// (textual inversion, LoRA) needs only that gradient. In bf16, on a CPU that runs bf16 in oneDNN, the weight packed
// for the product (dYᵀ·w)ᵀ (core/onednn_matmul.h): SD-1.5's 3x3 convolutions of 1280 channels run it at 147 GFLOP/s
// from the plain weight and 316 packed at 4x4, 290 and 400 at 8x8 (bench_gemm). Otherwise the weight's transpose
// [Cin·kh·kw, Cout] made contiguous, which the GEMM runs 1.3-2.2x faster than the transposed view at those sizes.
// Either costs the weight's size again and is remade when the weight changes; full training never makes one.
// Held by its layer and by the autograd graph until the backward has run (hence reference-counted).
class FrozenWeight : public torch::CustomClassHolder {
 public:
  // The patch columns' gradient [N, Cin·kh·kw, H'·W'], wᵀ·dY_s for each image s, from the flattened weight w
  // [Cout, Cin·kh·kw] (a view of the layer's weight) and the output maps' gradient dy [N, Cout, H'·W'].
  at::Tensor columns_gradient(const at::Tensor& w, const at::Tensor& dy);
  int64_t bytes() const;

 private:
  PackedMatrix packed_;
  at::Tensor transposed_;
  c10::Storage source_;  // held, so that a new weight cannot reuse its address and pass for it
  int64_t source_version_ = 0;
};

// Zero padding, no dilation, no groups: x [N, Cin, H, W], weight [Cout, Cin, kh, kw], bias [Cout] or undefined ->
// [N, Cout, H', W']. Differentiable in all three. With `frozen`, a GEMM convolution whose weight and bias take no
// gradient but whose input does computes that gradient through `frozen`.
at::Tensor conv2d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, at::IntArrayRef stride,
                  at::IntArrayRef padding, const c10::intrusive_ptr<FrozenWeight>& frozen = {});

// The im2col + GEMM computation itself, whatever the size (for benchmarks and tests). With `frozen`, the input
// gradient is computed through it and the weight and bias get none.
at::Tensor conv2d_as_gemm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, at::IntArrayRef stride,
                          at::IntArrayRef padding, const c10::intrusive_ptr<FrozenWeight>& frozen = {});

// Whether conv2d() computes this convolution as im2col + GEMM (on a CPU: float32 up to 256 output pixels over the
// whole batch; bf16 1x1 up to 1024, other bf16 kernels on maps of at most 8x8 up to 256).
bool conv2d_runs_as_gemm(const at::Tensor& x, const at::Tensor& weight, at::IntArrayRef stride,
                         at::IntArrayRef padding);

}  // namespace sd::models
