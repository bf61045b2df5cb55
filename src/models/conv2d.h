// How the models run a 2-D convolution. LibTorch 1.13 on CPU runs convolutions in oneDNN (a few shapes in its own
// im2col kernel), which in float32 reaches 120-150 GFLOP/s on SD's 32x32 and 64x64 feature maps but only 15-30
// GFLOP/s on the 8x8 and 4x4 maps of the lowest UNet levels, where a batch has few pixels and many channels. There,
// unfolding the input (im2col) and running one GEMM over every image and pixel is 2-4x faster, forward and backward
// (bench/bench_conv). In bf16 the same holds on 8x8 and 4x4 maps and, for 1x1 kernels, up to 32x32. Every other
// case, and every other dtype or device, takes LibTorch's own convolution.
#pragma once
#include <ATen/ATen.h>

namespace sd::models {

// Zero padding, no dilation, no groups: x [N, Cin, H, W], weight [Cout, Cin, kh, kw], bias [Cout] or undefined ->
// [N, Cout, H', W']. Differentiable in all three.
at::Tensor conv2d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, at::IntArrayRef stride,
                  at::IntArrayRef padding);

// The im2col + GEMM computation itself, whatever the size (for benchmarks and tests).
at::Tensor conv2d_as_gemm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, at::IntArrayRef stride,
                          at::IntArrayRef padding);

// Whether conv2d() computes this convolution as im2col + GEMM (on a CPU: float32 up to 256 output pixels over the
// whole batch; bf16 1x1 up to 1024, other bf16 kernels on maps of at most 8x8 up to 256).
bool conv2d_runs_as_gemm(const at::Tensor& x, const at::Tensor& weight, at::IntArrayRef stride,
                         at::IntArrayRef padding);

}  // namespace sd::models
