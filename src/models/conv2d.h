// How the models run a 2-D convolution. LibTorch 1.13 on CPU runs convolutions in oneDNN (a few shapes in its own
// im2col kernel), which in float32 reaches 120-150 GFLOP/s on SD's 32x32 and 64x64 feature maps but only 15-30
// GFLOP/s on the 8x8 and 4x4 maps of the lowest UNet levels, where a batch has few pixels and many channels. There,
// unfolding the input (im2col, models/im2col.h) and running one GEMM over every image and pixel is 2-4x faster, forward
// and backward (bench/bench_conv). In bf16 the same holds on 8x8 and 4x4 maps and, for 1x1 kernels, up to 32x32. Every
// other case, and every other dtype or device, takes LibTorch's own convolution.
#pragma once
#include <ATen/ATen.h>

namespace sd::models {

// A frozen weight's transpose [Cin·kh·kw, Cout], made contiguous once and kept by its layer. Training through a
// frozen convolution (textual inversion, LoRA) needs only the input gradient, weightᵀ·dY, which the GEMM runs
// 1.3-2.2x faster from this copy than from the transposed view of the weight on the 8x8 and 4x4 maps of SD's lower
// levels (bf16, 1280 channels). The copy costs the weight's size again; full training never makes one.
class FrozenWeightTranspose {
 public:
  // The transpose of `weight`, remade when the weight has changed since (new storage, or written in place).
  const at::Tensor& of(const at::Tensor& weight);
  int64_t bytes() const { return transposed_.defined() ? static_cast<int64_t>(transposed_.nbytes()) : 0; }

 private:
  at::Tensor transposed_;
  c10::Storage source_;  // held, so that a new weight cannot reuse its address and pass for it
  int64_t source_version_ = 0;
};

// Zero padding, no dilation, no groups: x [N, Cin, H, W], weight [Cout, Cin, kh, kw], bias [Cout] or undefined ->
// [N, Cout, H', W']. Differentiable in all three. With `frozen`, a GEMM convolution whose weight and bias take no
// gradient but whose input does computes that gradient from frozen->of(weight).
at::Tensor conv2d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, at::IntArrayRef stride,
                  at::IntArrayRef padding, FrozenWeightTranspose* frozen = nullptr);

// The im2col + GEMM computation itself, whatever the size (for benchmarks and tests). `weight_t`, if given, is the
// weight's contiguous transpose, from which the input gradient is computed; the weight and bias then get none.
at::Tensor conv2d_as_gemm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, at::IntArrayRef stride,
                          at::IntArrayRef padding, const at::Tensor& weight_t = {});

// Whether conv2d() computes this convolution as im2col + GEMM (on a CPU: float32 up to 256 output pixels over the
// whole batch; bf16 1x1 up to 1024, other bf16 kernels on maps of at most 8x8 up to 256).
bool conv2d_runs_as_gemm(const at::Tensor& x, const at::Tensor& weight, at::IntArrayRef stride,
                         at::IntArrayRef padding);

}  // namespace sd::models
