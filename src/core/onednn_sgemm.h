// float32 matrix products as LibTorch's CPU at::mm and at::addmm compute them, without their ops.
//
// LibTorch's float32 GEMMs reach BLAS through sgemm_, which sdtrain defines (core/onednn_sgemm.cpp: it runs them in
// oneDNN). at::mm and at::addmm wrap that one call in ~8 dispatched ops (resolve_conj of each operand, the transposed
// views, the bias's expand and copy), and a linear layer's weight.t() adds three more: on tiny-sd1, whose products
// take a few µs each, the ops cost about as much as the arithmetic. These make the same sgemm_ call addmm_impl_cpu_
// makes (the operands' order, transposes and leading dimensions), so the products are at::mm's to the bit.
#pragma once
#include <ATen/ATen.h>

namespace sd {

// Whether float32_matmul takes a [M, K] and b [K, N]: 2-D float32 CPU tensors, each row-major or column-major (a
// transposed view), every dimension above one (where LibTorch renormalizes the strides of size-one dimensions).
bool float32_matmul_fits(const at::Tensor& a, const at::Tensor& b);

// at::mm(a, b): a new contiguous [M, N] tensor.
at::Tensor float32_matmul(const at::Tensor& a, const at::Tensor& b);

// A linear layer's x [M, K] times weight [N, K] transposed, plus bias [N] (float32, contiguous) if defined, as
// at::addmm(bias, x, weight.t()) (or at::mm) computes it, without building the transposed view.
bool float32_linear_fits(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);
at::Tensor float32_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

// Each sample's at::addmm(bias.unsqueeze(1), a, b[s]) (or at::mm(a, b[s]) without bias) for a [M, K] and b [S, K, N],
// into a new [S, M, N]: a GEMM convolution's weight times each image's columns, landing as the layer's maps, where
// one product over the batch's [K, S·N] columns needs a copy into that matrix and another out of it. b's samples fit
// as float32_matmul_fits takes a matrix; bias is [M] float32 and contiguous, or undefined.
bool float32_per_sample_fits(const at::Tensor& a, const at::Tensor& b);
at::Tensor float32_addmm_per_sample(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b);

}  // namespace sd
