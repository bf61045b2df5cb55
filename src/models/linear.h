// How the models run a linear layer: y = x·Wᵀ + b, differentiable in all three, as at::linear. bf16 on a CPU takes
// oneDNN primitives kept per shape (core/onednn_matmul.h), forward and backward, with the same products as
// at::linear's; float32 on a CPU takes at::linear's own products in one autograd node (at::linear records ~15 ops
// and three nodes a layer: tiny-sd1's textual-inversion step 10,570 -> 9,358 ops), except that layers of few tokens
// and a large weight on an AVX-512 CPU multiply their forward as (W·xᵀ + b)ᵀ; every other dtype, shape or device
// takes at::linear itself.
#pragma once
#include <ATen/ATen.h>

namespace sd::models {

// x [..., in], weight [out, in], bias [out] or undefined -> [..., out].
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// Whether `linear` multiplies this layer's forward as (W·xᵀ + b)ᵀ: float32 x [batch, tokens, in] with 16-80 tokens
// and a weight of 2^20 elements or more, on a CPU whose sgemm runs AVX-512 kernels.
bool transposed_product_is_faster(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

}  // namespace sd::models
