// The patch unfolding (im2col) under the GEMM convolution of models/conv2d.h, and its adjoint (col2im) as its
// backward, for CPU tensors (float32, float64, bf16). LibTorch 1.13's own im2col and col2im walk every element with
// its own index arithmetic (bf16, one 1280-channel 8x8 map with a 3x3 kernel: 0.5-0.7 ms and 1.1 ms), and in bf16 its
// col2im rounds the map to bf16 after each of the kh·kw additions. These copy each plane into a zero-padded one and
// every row of patch entries out of it in a few fixed-size moves (`build/bench_im2col`, that map on one thread: 0.04
// and 0.14 ms), and the adjoint sums in float32 (float64 for float64) and rounds once, as oneDNN's convolution
// backward does.
#pragma once
#include <ATen/ATen.h>

namespace sd::models {

// x [N, C, H, W] -> [N, C·kh·kw, H'·W'] (at::im2col's layout, no dilation), differentiable in x.
at::Tensor unfold_patches(const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef padding, at::IntArrayRef stride);

// The adjoint: columns [N, C·kh·kw, H'·W'] -> [N, C, H, W], every column entry added where it was read from.
at::Tensor fold_patches(const at::Tensor& columns, at::IntArrayRef map_size, at::IntArrayRef kernel,
                        at::IntArrayRef padding, at::IntArrayRef stride);

}  // namespace sd::models
